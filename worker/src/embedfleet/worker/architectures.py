"""Which model architectures the worker serves, and the one-line refusal of the rest.

Torch-free and read from config.json alone, so a worker given a model it cannot serve says so
before any weights are read or heavy library imported: exit code `exits.EXIT_REFUSED` (78) and
the line on stderr and in the termination message file (docs/worker.md, "Refused models").
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, NoReturn

from embedfleet.common.exits import EXIT_REFUSED
from embedfleet.common.modeldir import (
    Head,
    ModelDir,
    ModelDirError,
    NoModelDirError,
    load_model_dir,
    resolve_model_path,
)

log = logging.getLogger(__name__)

#: where users ask for an architecture (a placeholder until the project's tracker is public)
ISSUES_URL = "https://github.com/embedfleet/embedfleet/issues"

#: config.json model_type -> the heads it is served with (modeldir.Head)
SERVED: dict[str, tuple[Head, ...]] = {
    "bert": ("pool", "classifier", "splade", "lexical", "colbert", "hybrid"),
    "roberta": ("pool", "classifier", "splade", "lexical", "colbert", "hybrid"),
    "xlm-roberta": ("pool", "classifier", "splade", "lexical", "colbert", "hybrid"),
    "camembert": ("pool", "classifier", "splade", "lexical", "colbert", "hybrid"),
    "distilbert": ("pool", "colbert"),
    "mpnet": ("pool", "colbert"),
    "modernbert": ("pool", "colbert"),
    "qwen3": ("pool", "yes_no"),
    "qwen2": ("pool",),
    "mistral": ("pool",),
    "gemma3_text": ("pool",),
}

#: model types whose checkpoints' own modeling code (auto_map) is a copy of the `transformers`
#: class the engine is checked against: gte-Qwen2 ships Qwen2 classes, run causally with
#: last-token pooling as MTEB and TEI run them
CUSTOM_CODE_CHECKED = frozenset({"qwen2"})

#: architectures users bring that are not served, and why (model_type -> reason)
REFUSED: dict[str, str] = {
    "nomic_bert": "NomicBERT (nomic-embed-text) ships its modeling code with its weights, not in "
    "transformers, and no reference implementation runs here to check one against",
    "new": "Alibaba GTE v1.5 (model_type new) ships its modeling code with its weights, not in "
    "transformers, and no reference implementation runs here to check one against",
}

#: a custom architecture under a served model_type (JinaBERT's JinaBertModel is model_type bert)
CUSTOM_CODE = (
    "ships its modeling code with its weights (config.json auto_map), not in transformers: "
    "JinaBERT (ALiBi) and jina-embeddings-v3 (LoRA) are such models, and no reference "
    "implementation runs here to check one against"
)

#: how each head is named to users, by the task it serves
_TASKS_OF: dict[Head, str] = {
    "pool": "embed",
    "classifier": "score/classify",
    "splade": "sparse",
    "lexical": "sparse",
    "yes_no": "score",
    "colbert": "multivector",
    "hybrid": "hybrid",
}


def served_list() -> str:
    """What is served, by task: 'embed: bert, ...; score/classify: ...'."""
    by_task: dict[str, set[str]] = {}
    for kind, heads in SERVED.items():
        for head in heads:
            by_task.setdefault(_TASKS_OF[head], set()).add(kind)
    return "; ".join(f"{task}: {', '.join(sorted(kinds))}" for task, kinds in by_task.items())


def custom_architectures(config: dict[str, Any]) -> list[str]:
    """The checkpoint's own classes that its auto_map says come with it (custom code)."""
    auto_map = config.get("auto_map") or {}
    targets = auto_map.values() if isinstance(auto_map, dict) else ()
    provided = {str(t).rsplit(".", 1)[-1] for t in targets if isinstance(t, str)}
    return [str(a) for a in config.get("architectures") or () if str(a) in provided]


def refusal(model: ModelDir) -> str | None:
    """The one-line reason `model` cannot be served, None when it can."""
    kind = model.model_type
    custom = [] if kind in CUSTOM_CODE_CHECKED else custom_architectures(model.config)
    if custom:
        why = f"its architecture {custom[0]} {CUSTOM_CODE}"
    elif kind in REFUSED:
        why = REFUSED[kind]
    elif model.head in SERVED.get(kind, ()):
        return None
    elif kind in SERVED:
        tasks = ", ".join(dict.fromkeys(_TASKS_OF[h] for h in SERVED[kind]))
        why = f"it is served for {tasks} only, not {_TASKS_OF[model.head]} ({model.task})"
    else:
        why = "no engine family implements it"
    return (
        f"unsupported model: model_type {kind!r} cannot be served: {why}. embedfleet serves "
        f"{served_list()}. Ask for it at {ISSUES_URL}"
    )


def check(model: str, task: str) -> str | None:
    """The refusal of the model directory `model` for `task`: an architecture not served, or a
    directory that is not one we can read (its ModelDirError's message); None to go on."""
    try:
        return refusal(load_model_dir(resolve_model_path(model), task))
    except NoModelDirError as err:
        return str(err)
    except ModelDirError as err:
        return f"unsupported model: {err}. Ask at {ISSUES_URL}"


def exit_refused(line: str, termination_message_path: str) -> NoReturn:
    """Says `line` (a log record, the termination message, the plain line last on stderr) and
    exits with EXIT_REFUSED: no traceback."""
    log.error("model refused", extra={"reason": line})
    write_termination_message(termination_message_path, line)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    sys.exit(EXIT_REFUSED)


def write_termination_message(path: str, line: str) -> None:
    """Into the file the kubelet made (never creating one: a local run must not litter /dev)."""
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError:
        return
    with os.fdopen(fd, "w") as out:
        out.write(line)


def main(argv: list[str] | None = None) -> None:
    """`python -m embedfleet.worker.architectures MODEL [TASK]`: the refusal line on stderr and
    exit code EXIT_REFUSED, or nothing and 0. `embedfleet serve` runs it before any child starts
    (a process boundary: the fleet imports no worker module)."""
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        sys.exit("usage: python -m embedfleet.worker.architectures MODEL [TASK]")
    line = check(args[0], args[1] if len(args) == 2 else "auto")
    if line is not None:
        sys.stderr.write(line + "\n")
        sys.exit(EXIT_REFUSED)


if __name__ == "__main__":
    main()
