"""The jobs behind the command line, as library functions: each drives a generation engine over a
dataset and writes files that the next job reads. The command line parses options, calls one of
these and prints.

=================  ==============================================================================
``engine``         the generation engines (vLLM, transformers), their settings, ``make_engine``
``collect``        sample, grade and write N candidates per problem (``run_collect``)
``bon``            Best-of-N valued in vLLM (SWIFT with a head, head-free values, SAR), with pruning
                   compared (``run_bon``)
``data_parallel``  ``LLM.generate``'s interface over vLLM's data-parallel engine
``train``          a head trained on graded rollouts and written (``plan_train``, ``run_train``)
=================  ==============================================================================
"""
