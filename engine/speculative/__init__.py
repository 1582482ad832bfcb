"""Speculative decoding: something cheap proposes k tokens, the target checks them
all in one forward pass, and the longest acceptable prefix is kept plus one token
from the target. Two proposers share one small interface (`Proposer`): a small draft
model (`Speculator`), or n-gram prompt lookup (`NgramProposer`, vLLM's `ngram`
method), which copies what followed the last few tokens when they occurred before.
The engine's config names one (SpeculativeConfig); every round is checked by verify().

The output follows exactly the target's distribution (the rejection rule: verify.py).

proposer.py: the Proposer interface and SpeculativeConfig (which one, built how);
draft.py: the draft model (Speculator); ngram.py: prompt lookup; verify.py: the rule.
"""
