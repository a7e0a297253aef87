"""The rewards and their math, model- and engine-independent (DESIGN 2).

=================  ==============================================================================
``head``           the SWIFT head: weights, layers, alignment, file format, model fingerprint
``scoring``        SWIFT scores from per-layer hidden states (the reference every path matches)
``sar``            the self-aligned reward from log-probs (SAR paper Eq. 8-9)
``sar_context``    SAR's question-removed context ``q0``
``confidence``     DeepConf's token confidence and its group signals
=================  ==============================================================================
"""
