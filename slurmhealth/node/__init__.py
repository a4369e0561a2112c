"""What runs on a compute node, before and after every job: the agent, the runner, checks and
sources. Rules: standard library only on the prolog path (50 ms budget), every source read under
a deadline, fail open (our bug or a broken store never drains a node). Imports only core."""
