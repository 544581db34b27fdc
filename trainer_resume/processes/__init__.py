"""The processes a trainer runs beside: who a process is, and its children dying with it.

``names`` tells a process by pid, host and (on Linux) boot, pid namespace and start
time, and whether a named process has certainly ended (the resume points' lock takes
over from a dead writer by it); ``parent_death`` ties the processes a trainer starts to
its life; ``inherited_objects`` keeps a forked worker from collecting its parent's
garbage. None imports anything else of the package.
"""
