"""``horo.common``: the framework-free modules under Horovod's ``horovod.common`` names.

``horo.common.exceptions`` (the errors elastic scripts catch), ``horo.common.elastic`` (the state classes) and
``horo.common.process_sets``. Each re-exports horo's own objects; see docs/migrating.md.
"""
