"""Upload checks of the inputs' ``text`` pipelines: the vocabulary, the inputs they fill, and
the graph's embedding.

A text pipeline sits on the token ids input and fills the inputs its `token_types` and
`valid_length` name. At upload its vocabulary is read (from the version's folder, where an
upload's ``vocab`` part is kept, or beside config.json), and checked: BERT's special tokens
present, no more tokens than the embedding that reads the ids has rows. The inputs must exist
with the ranks BERT takes (ids and types ``[-1, L]``, lengths ``[-1]``), agree on a fixed `L`,
and hold every id exactly; padded rows must not reach past the model's position table
(`engine.serving.text_positions`). The pipelines built here are kept beside the model
(`pipelines_of`).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.serving.config import CONFIG_NAME
from engine.serving.errors import InvalidModel
from engine.serving.text import TextPipeline
from engine.serving.text_config import TextPreprocess
from engine.serving.text_positions import check_positions
from engine.serving.wordpiece import Vocabulary, VocabularyError

# A sample long enough to be truncated at any max_length: the dry run's rows are the longest.
_DRY_TEXTS = ("the quick brown fox jumps over the lazy dog, " * 400,
              "and then it sleeps! " * 400)

_PIPELINES: weakref.WeakKeyDictionary[Any, dict[str, TextPipeline]] = (
    weakref.WeakKeyDictionary())


def pipelines_of(model: object) -> dict[str, TextPipeline]:
    """The text pipelines `check_text` built for `model`, by input name ({}: none)."""
    try:
        return _PIPELINES.get(model, {})
    except TypeError:  # not weakly referenceable: never validated here
        return {}


def check_text(model: Any, inputs: Sequence[Any], version_dir: Path | None,
               where: str) -> dict[str, np.ndarray]:
    """Check every text pipeline of the completed `inputs` and dry-run it on a long pair.

    Returns:
        One row of every input the pipelines fill (the ids input's included), by input name.

    Raises:
        InvalidModel: a vocabulary is missing or unusable, or a pipeline does not fit.
    """
    by_name = {tensor.name: (index, tensor) for index, tensor in enumerate(inputs)}
    pipelines, rows = {}, {}
    for index, tensor in enumerate(inputs):
        options = tensor.preprocess.text if tensor.preprocess is not None else None
        if options is None:
            continue
        field = f"{where}: inputs.{index}.preprocess.text"
        vocab = _read_vocab(version_dir, options, field)
        fixed = _check_inputs(tensor, options, by_name, field)
        _check_vocab_size(model, tensor.graph_name, len(vocab), field)
        dtypes = {name: by_name[name][1].dtype for name in (tensor.name, *options.filled)}
        _check_exact(dtypes[tensor.name], len(vocab), tensor.name, field)
        pipeline = TextPipeline.build(options, vocab, tensor.name, dtypes, fixed)
        encoded = pipeline.encode([_DRY_TEXTS])
        check_positions(model, {by_name[name][1].graph_name: array
                                for name, array in encoded.items()},
                        encoded[tensor.name].shape[1], field)
        rows.update({name: array[0] for name, array in encoded.items()})
        pipelines[tensor.name] = pipeline
    if pipelines:
        _PIPELINES[model] = pipelines
    return rows


def _read_vocab(version_dir: Path | None, options: TextPreprocess, field: str) -> Vocabulary:
    folders = [] if version_dir is None else [version_dir]
    # Only a numbered version folder has a model folder above it (not an upload's staging).
    if version_dir is not None and version_dir.name.isdigit() and (
            version_dir.parent / CONFIG_NAME).is_file():
        folders.append(version_dir.parent)
    path = next((folder / options.vocab for folder in folders
                 if (folder / options.vocab).is_file()), None)
    if path is None:
        raise InvalidModel(f"{field}.vocab: no file {options.vocab!r} in the version's folder "
                           f"or beside {CONFIG_NAME}; upload it as part 'vocab' (file name "
                           f"{options.vocab!r})")
    try:
        return Vocabulary.read(path)
    except VocabularyError as error:
        raise InvalidModel(f"{field}.vocab: {options.vocab!r}: {error}") from None
    except OSError as error:
        raise InvalidModel(f"{field}.vocab: cannot read {options.vocab!r}: {error}") from None


def _check_inputs(tensor: Any, options: TextPreprocess,
                  by_name: Mapping[str, tuple[int, Any]], field: str) -> int | None:
    """Refuse inputs that are not BERT's; the sequence length the graph fixes, if any."""
    wanted = {tensor.name: ("token ids", 2), options.token_types: ("token types", 2),
              options.valid_length: ("valid lengths", 1)}
    lengths = set()
    for name, (what, rank) in wanted.items():
        if name is None:
            continue
        if name not in by_name:
            raise InvalidModel(f"{field}: names input {name!r} for the {what}; the model's "
                               f"inputs are {list(by_name)}")
        other = by_name[name][1]
        if name != tensor.name and other.preprocess is not None:
            raise InvalidModel(f"{field}: input {name!r} gets the {what} from this pipeline, "
                               "so it cannot have a preprocess of its own")
        if len(other.shape) != rank or other.datatype == "BOOL":
            shape = "[-1, L]" if rank == 2 else "[-1]"
            raise InvalidModel(f"{field}: input {name!r} has shape {list(other.shape)} "
                               f"({other.datatype}); the {what} need a numeric {shape}")
        if rank == 2 and other.shape[1] > 0:
            lengths.add(other.shape[1])
    if len(lengths) > 1:
        raise InvalidModel(f"{field}: the token ids and types inputs fix different sequence "
                           f"lengths {sorted(lengths)}")
    fixed = next(iter(lengths), None)
    if fixed is not None and (options.max_length > fixed or options.padding == "longest"):
        raise InvalidModel(f"{field}: the graph fixes the sequence length at {fixed}, so rows "
                           f"are padded to it: max_length ({options.max_length}) must be at "
                           f"most {fixed}, and padding \"max_length\"")
    return fixed


def _check_vocab_size(model: Any, ids_variable: str, size: int, field: str) -> None:
    """Refuse a vocabulary larger than the rows of an Embedding reading the ids directly."""
    graph = getattr(model, "graph", None)
    if graph is None:
        return
    variables = {index for index, node in enumerate(graph.nodes)
                 if node.is_variable and node.name == ids_variable}
    for node in graph.nodes:
        if node.op != "Embedding" or not node.inputs or node.inputs[0].node not in variables:
            continue
        rows = int(node.params["input_dim"])
        if size > rows:
            raise InvalidModel(f"{field}.vocab: the vocabulary has {size} tokens, but "
                               f"{node.describe()} embeds only {rows} (input_dim); is it the "
                               "model's vocab.txt?")


def _check_exact(dtype: np.dtype, size: int, name: str, field: str) -> None:
    """Refuse an ids datatype that cannot hold every token id exactly (FP16 past 2048)."""
    largest = size - 1
    if np.dtype(dtype).kind == "f":
        exact = largest <= 2 ** (np.finfo(dtype).nmant + 1)
    else:
        exact = largest <= np.iinfo(dtype).max
    if not exact:
        raise InvalidModel(f"{field}: input {name!r} is {np.dtype(dtype)}, which cannot hold "
                           f"token id {largest} exactly")
