"""The checks that run before anything changes.

A pause is checked before it is written (what a weights-only load would refuse, what
each hook returned), a pause file before ``resume()`` changes anything (its layout, its
names, each saved state against the live object it will be loaded into), a loader's
state before its loader takes it. Each module here is one kind of check, shared by the
whole package.
"""
