"""Files written by earlier versions of the package, and the tests that resume them."""
