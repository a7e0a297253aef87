"""What every layer leans on and nothing of the product's math: progress output, keeping an
engine's logs out of a job's output, file digests.

===============  ================================================================================
``progress``     one bar per phase on a terminal, one line per phase elsewhere
``engine_logs``  vLLM's own output kept out of a job's (a log file)
``files``        file digests (head provenance, compile-cache keys, demo assets)
===============  ================================================================================
"""
