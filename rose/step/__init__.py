"""One step's path, in reading order: ``inputs.py`` (the arena as the
model's inputs), ``runner.py`` (defaults resolved, then the runtimes in
order), the runtimes that run the model itself (``static.py`` with the
graph ``graphs.py`` dispatcher, ``eager.py``), the hardware seam
(``device.py``) and the staged output's buffers (``staging.py``); the
output itself is ``rose/lazy.py``'s LazyTensor. Image steps read the same
way: ``image_inputs.py``, then ``images.py`` on the same device."""
