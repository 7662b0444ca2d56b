"""LoRA adapters: the artifact and its file, the factors and how they apply to a decoder, PEFT's format.

- :mod:`.artifact`: the sidecar's fields and the names and shapes of the factors (no torch);
- :mod:`.file`: an adapter's safetensors file read wholly and checked against its sidecar (no torch);
- :mod:`.factors`: one projection's low-rank update and how it is added to that projection's output;
- :mod:`.lora`: an adapter's tensors drawn, loaded, attached to a decoder, folded and written;
- :mod:`.apply`: every check of an adapter a command is given, then its attachment;
- :mod:`.peft_format`: the interchange with PEFT's adapter directories.

Nothing is imported here, so a module that needs no torch (the first two) loads without it.
"""
