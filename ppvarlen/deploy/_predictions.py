"""Per-task prediction objects (moved into the tasks once they exist)."""
from typing import Literal

from pydantic import BaseModel, Field


def classification_prediction(label_names):
    Label = Literal[tuple(label_names)]

    class ClassificationPrediction(BaseModel):
        label: Label = Field(description="the most probable label")
        label_id: int = Field(ge=0, lt=len(label_names), description="its index in the labels")
        probs: dict[Label, float] = Field(description="probability of every label")
        num_tokens: int = Field(ge=1, description="tokens of the text, special tokens excluded")
        truncated: bool = Field(description="the text was cut to the export's max_len")

    return ClassificationPrediction


class Entity(BaseModel):
    type: str
    text: str = Field(description="text[start:end]")
    start: int = Field(ge=0, description="character offset in the request text")
    end: int = Field(ge=0, description="character offset, exclusive")


def tagging_prediction(label_names):
    Tag = Literal[tuple(label_names)]

    class TaggingPrediction(BaseModel):
        entities: list[Entity] = Field(description="chunks of the tag scheme, in text order")
        tags: list[Tag] = Field(description="one tag per token")
        num_tokens: int = Field(ge=1)
        truncated: bool

    return TaggingPrediction


def seq2seq_prediction(label_names):
    class Seq2SeqPrediction(BaseModel):
        output: str = Field(description="the generated text")
        output_ids: list[int] = Field(description="generated ids, without BOS/EOS")
        num_tokens: int = Field(ge=1, description="source tokens")
        truncated: bool
        pieces: int = Field(ge=1, description="source pieces decoded (Deploy.split_long_sources)")

    return Seq2SeqPrediction


PREDICTIONS = {"classification": classification_prediction, "tagging": tagging_prediction,
               "seq2seq": seq2seq_prediction}
EXAMPLES = {"classification": ["物流很快，包装完好", "质量太差了"],
            "tagging": ["江泽民在北京会见了客人"], "seq2seq": ["中国人民"]}
