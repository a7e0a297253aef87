"""What a run reports: Best-of-N tables with their intervals, the pruning comparison, and the
plots both draw.

=============  ==================================================================================
``best_of_n``  accuracy of each selector at each k, bootstrap intervals, the lines under a table
``pruning``    pruned against full Best-of-N, sweeps of settings replayed on full runs
``plotting``   what every figure shares: titles that fit, how to read it, file settings
=============  ==================================================================================
"""
