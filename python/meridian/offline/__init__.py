"""Offline vLLM: the engine loop that stands in for vLLM's ``EngineCore`` and the tiny model's
format.

``meridian.offline.engine`` drives any vLLM scheduler class (stock or Meridian's) through
``EngineCore.step_with_batch_queue``'s call sequence with scripted model outputs on a virtual
clock; the replay, the scripted demo and the tests all run on it, and one test compares it with
a real ``EngineCore``. ``meridian.offline.tiny`` is the tiny reasoning model's vocabulary, model
folder and task format. Nothing here imports vLLM at module import time.
"""
