"""Choosing among candidates: Best-of-N and its rules (ties, NaN, votes, oracle, random pick, the
bootstrap over problems), and pruning candidates while they are generated.

=============  ==================================================================================
``bon``        selection by a score, votes, rank and scaled combinations, oracle and random picks
``bootstrap``  the percentile bootstrap over problems every interval of a report or a verdict uses
``pruning``    the pruning settings, the one policy every signal goes through, its replay
=============  ==================================================================================
"""
