"""Task registry: ``get_task(name)`` -> a fresh ``Task`` (``ppvarlen.tasks.base``).

The only place that maps task names to behaviour; everything else asks the Task object
(tests/test_hygiene.py fails on a task-name comparison anywhere else).  The serving path
imports the tasks without paddle: the methods that train or evaluate import it when they run.
"""
from ..config import ConfigError
from .base import Task
from .classification import ClassificationTask
from .embedding import EmbeddingTask
from .extractive_qa import ExtractiveQATask
from .masked_lm import MaskedLMTask
from .seq2seq import Seq2SeqTask
from .tagging import TaggingTask
from .text_pair import TextPairTask

TASKS = {t.name: t for t in (ClassificationTask, TaggingTask, Seq2SeqTask, MaskedLMTask,
                              TextPairTask, ExtractiveQATask, EmbeddingTask)}


def get_task(task):
    """A Task object for a name (a Task passes through), ConfigError for an unknown name."""
    if isinstance(task, Task):
        return task
    if task not in TASKS:
        raise ConfigError(f"task {task!r} is not one of {sorted(TASKS)}")
    return TASKS[task]()


__all__ = ["Task", "TASKS", "get_task"]
