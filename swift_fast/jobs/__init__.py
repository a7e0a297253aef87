"""The jobs behind the command line, as library functions: each drives a generation engine over a
dataset and writes files that the next job reads. The command line parses options, calls one of
these and prints.

=================  ==============================================================================
``collect``        sample, grade and write N candidates per problem (vLLM or transformers)
``data_parallel``  ``LLM.generate``'s interface over vLLM's data-parallel engine
=================  ==============================================================================
"""
