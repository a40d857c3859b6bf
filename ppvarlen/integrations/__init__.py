"""Optional integrations with other systems; each module imports its system itself.

``ray_batch`` (batch inference on Ray Data) and ``ray_serve`` (serving on Ray Serve) need
the ``ray`` extra; ``paddlenlp_trainer`` brings ppvarlen's samplers into PaddleNLP's
``Trainer``. Importing ``ppvarlen`` or any other subpackage never imports them.
"""
