"""Data in and out: benchmark loaders, the prompts' templates and rollout files.

=============  ==================================================================================
``datasets``   GSM8K, MATH-500, AQuA and generic JSONL, each problem with its grading kind
``templates``  instruction templates per dataset (the SWIFT paper's prompts)
``rollouts``   rollout files: one problem per line with its candidates, written resumably
=============  ==================================================================================
"""
