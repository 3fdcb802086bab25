"""``byte-llama``, the built-in language model: ``model`` (the plain module, its FLOPs per token)
and ``parallelize`` (torchtitan's tensor-parallel, FSDP2 and pipeline plans for it)."""
