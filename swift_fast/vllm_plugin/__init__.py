"""vLLM general plugin (entry point ``vllm.general_plugins``)."""


def register() -> None:
    """Called by vLLM in every process; does nothing unless a head is configured."""
