"""PolyLoop inside other frameworks: each subpackage wraps one (its SDK imported only there).

* :mod:`polyloop.integrations.inspect`: PolyLoop as the agent of an Inspect AI task (extra
  ``polyloop[inspect]``).
"""
