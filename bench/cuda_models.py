#!/usr/bin/env python3
"""Random-weight checkpoints shaped like Llama-3.1-8B for the GPU benchmarks (make bench-cuda),
and GGUF twins of them holding the same values, for llama.cpp.

    python3 bench/cuda_models.py --out DIR [--bits 4] [--group 64] [--layers 32] [--gguf q4_0[,..]]
                                 [--hidden D] [--ffn F] [--heads H] [--kv-heads HK] [--vocab V]

writes DIR/config.json and DIR/model.safetensors in mlx-lm's layout: every linear layer
(the embedding and the untied LM head included) as MLX affine codes with fp16 scales and
biases, norms in fp16. Codes are uniform random, scale ~ U(0.004, 0.008) / 2^(bits - 4)
(so 4- and 8-bit weights span the same range) and bias = -2^(bits - 1) * scale, which is
all a speed measurement needs: the bytes read per token are those of the real model.
Nothing here is a correctness reference. --hidden and the rest give smaller shapes (the
pairing check of bench/cuda.py runs on one).

--gguf TYPES writes DIR.<type>.gguf beside DIR for each type, the same tensors laid out as
llama.cpp's converter does (tools/gguf_layout.py: its names, q/k rows in its RoPE order,
norms F32) and the same values, block by block of 32 with the scale of the block's group:
  q4_1  d = scale, m = bias: any 4-bit checkpoint; from g32 also the same bytes per weight
        (5.0 bits)
  q4_0  d = scale, w = d (q - 8): 4-bit, since every bias is -8 * scale; 4.5 bits per
        weight like g64
  q8_0  d = scale, q - 128 as int8: 8-bit, since every bias is -128 * scale; 8.5 bits per
        weight like 8-bit g64
The GGUF vocabulary is a placeholder byte-level BPE one (the 256 byte symbols, one merge,
control tokens at the BOS/EOS ids, "<tN>" for the rest): enough for llama.cpp and celer to
load the file; the benchmarks never tokenize. GGUF carries llama3 RoPE scaling only as a
rope_freqs tensor, which celer does not read yet, so with --gguf config.json leaves out
rope_scaling and both files describe the same function (the same work per token).

--tokenizer NAME copies tests/tokenizers/NAME's tokenizer.json and tokenizer_config.json
into DIR (llama3_1 fits the default vocabulary), so `celer serve` can take the directory
(the serving benchmark on the GPU, bench/cuda_serve.sh); the text it writes is noise.

Only numpy, and with --gguf the gguf-py package of the llama.cpp tree (PYTHONPATH=
build/llama.cpp-cuda/src/gguf-py, bench/setup_cuda.sh), so it runs on the GPU machine:
models are made there, never copied. Tensors are drawn and written one at a time.
"""
import argparse
import json
import lzma
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from gguf_layout import BLOCK_BITS, BLOCK_BYTES, gguf_name, heads_for, mlx_to_blocks, permute  # noqa: E402

LLAMA31_8B = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
}

# llama.cpp's general.file_type of a file whose matrices are all of one type.
FILE_TYPE = {"q4_0": 2, "q4_1": 3, "q8_0": 7}
# K-quant super-blocks: (elements, bytes).
K_BLOCKS = {"q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210)}


def block_bytes(t, rows, cols):
    """Bytes of a [rows, cols] matrix of ggml type t."""
    if t in K_BLOCKS:
        n, b = K_BLOCKS[t]
        return rows * cols // n * b
    return rows * cols // 32 * BLOCK_BYTES[t]


def log(msg):
    print(f"cuda_models: {msg}", file=sys.stderr, flush=True)


# ==== Tensors ====


def specs(cfg):
    """(Hugging Face name, rows, cols) of every tensor in file order; cols 0 for a norm."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = d // cfg["num_attention_heads"]
    nq, nkv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", v, d)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", d, 0), (p + "self_attn.q_proj.weight", nq, d),
                (p + "self_attn.k_proj.weight", nkv, d), (p + "self_attn.v_proj.weight", nkv, d),
                (p + "self_attn.o_proj.weight", d, nq), (p + "post_attention_layernorm.weight", d, 0),
                (p + "mlp.gate_proj.weight", f, d), (p + "mlp.up_proj.weight", f, d),
                (p + "mlp.down_proj.weight", d, f)]
    out += [("model.norm.weight", d, 0), ("lm_head.weight", v, d)]
    return out


def mlx_entries(spec, bits, group):
    """safetensors (name, dtype, shape) of one spec: codes, scales, biases, or the norm."""
    name, rows, cols = spec
    if not cols:
        return [(name, "F16", (rows,))]
    base = name[: -len(".weight")]
    return [(base + ".weight", "U32", (rows, cols * bits // 32)), (base + ".scales", "F16", (rows, cols // group)),
            (base + ".biases", "F16", (rows, cols // group))]


def draw(spec, bits, group, rng):
    """The arrays of one spec, in mlx_entries' order."""
    _, rows, cols = spec
    if not cols:
        return [(1.0 + 0.02 * rng.standard_normal(rows)).astype(np.float16)]
    words = rows * cols * bits // 32
    # Whole 64-bit draws are numpy's fastest path; two code words each.
    codes = rng.integers(0, 2**64 - 1, size=words // 2, dtype=np.uint64, endpoint=True).view(np.uint32)
    scale_range = np.array([0.004, 0.008]) / 2 ** (bits - 4)
    scales = rng.uniform(*scale_range, size=(rows, cols // group)).astype(np.float16)
    biases = (np.float32(-(2 ** (bits - 1))) * scales.astype(np.float32)).astype(np.float16)
    return [codes.reshape(rows, cols * bits // 32), scales, biases]


# ==== Writers ====


class SafetensorsWriter:
    """A safetensors file written tensor by tensor: the header (every name, dtype, shape
    and offset) first, then the data in the same order."""

    SIZES = {"U32": 4, "F16": 2}

    def __init__(self, path, entries):
        header, offset = {}, 0
        for name, dt, shape in entries:
            n = self.SIZES[dt] * int(np.prod(shape))
            header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + n]}
            offset += n
        header["__metadata__"] = {"format": "mlx"}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.f = open(path, "wb")
        self.f.write(struct.pack("<Q", len(raw)))
        self.f.write(raw)

    def write(self, a):
        self.f.write(np.ascontiguousarray(a).data)

    def close(self):
        self.f.close()


def read_safetensors(path):
    """{name: array} of a safetensors file, memory-mapped (read-only)."""
    dtypes = {"U32": np.uint32, "F16": np.float16, "F32": np.float32}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        dt = np.dtype(dtypes[h["dtype"]])
        out[name] = np.memmap(path, dtype=dt, mode="r", offset=8 + n + lo, shape=tuple(h["shape"]))
        assert out[name].nbytes == hi - lo, name
    return out


def byte_level_symbols():
    """The 256 byte-level BPE symbols, in byte order: printable Latin-1 bytes stand for
    themselves, every other byte for the next code point from U+0100 up (the GPT-2 scheme
    that tokenizer.ggml.model "gpt2" expects)."""
    keep = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    out, extra = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def import_gguf():
    """llama.cpp's gguf-py package (on PYTHONPATH). Its metadata module imports yaml, for
    model cards that nothing here reads; where yaml is not installed an empty stand-in
    lets the package load."""
    try:
        import yaml  # noqa: F401
    except ImportError:
        import types

        sys.modules["yaml"] = types.ModuleType("yaml")
    import gguf

    return gguf


def gguf_writer(path, cfg, qtype, entries, mix=None, file_type=None):
    """A GGUFWriter for path with llama's metadata and the placeholder vocabulary, its
    tensor table filled in and written: the caller streams the data in entries' order.
    mix maps a tensor name to its own type (bench/kquant_models.py's mixes), else qtype;
    block_bytes(type, rows, cols) gives each matrix's bytes."""
    gguf = import_gguf()
    w = gguf.GGUFWriter(str(path), "llama")
    d, h = cfg["hidden_size"], cfg["num_attention_heads"]
    w.add_name(f"random Llama-3.1-8B-shaped {qtype}")
    w.add_file_type(FILE_TYPE[qtype] if file_type is None else file_type)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(h)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_dimension_count(d // h)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    special = {cfg["bos_token_id"], *cfg["eos_token_id"]}
    symbols = byte_level_symbols()
    space = symbols[ord(" ")]
    tokens = symbols + [space + space]
    tokens += [f"<|special_{i}|>" if i in special else f"<t{i}>" for i in range(len(tokens), cfg["vocab_size"])]
    types = [gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{space} {space}"])  # llama.cpp requires the key; one merge will do
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"][-1])
    w.add_add_bos_token(True)
    w.add_quantization_version(2)
    for name, rows, cols in entries:
        if cols:
            t = (mix or {}).get(name, qtype)
            nbytes = block_bytes(t, rows, cols)
            raw = getattr(gguf.GGMLQuantizationType, t.upper())
            w.add_tensor_info(gguf_name(name), (rows, nbytes // rows), np.dtype(np.uint8), nbytes, raw_dtype=raw)
        else:
            w.add_tensor_info(gguf_name(name), (rows,), np.dtype(np.float32), 4 * rows)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return w


def write_model(out, cfg, bits, group, ggufs, seed):
    """DIR (config.json, model.safetensors) and DIR.<type>.gguf for each type in ggufs, each
    written to a .part name and renamed when complete. Returns the bytes of each file."""
    for t in ggufs:
        if BLOCK_BITS[t] != bits:
            sys.exit(f"cuda_models: --gguf {t} holds {BLOCK_BITS[t]}-bit codes, the checkpoint {bits}-bit")
    if group % 32:
        sys.exit("cuda_models: --gguf needs a group size that is a multiple of 32")
    out = Path(out)
    tmp = out.with_name(out.name + ".part")
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = dict(cfg, quantization={"group_size": group, "bits": bits})
    if ggufs:
        cfg.pop("rope_scaling", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    sp = specs(cfg)
    st = SafetensorsWriter(tmp / "model.safetensors", [e for s in sp for e in mlx_entries(s, bits, group)])
    gg = {t: gguf_writer(Path(f"{out}.{t}.gguf.part"), cfg, t, sp) for t in ggufs}
    rng = np.random.default_rng(seed)
    for k, spec in enumerate(sp):
        arrays = draw(spec, bits, group, rng)
        for a in arrays:
            st.write(a)
        n_head = heads_for(spec[0], cfg)
        for t, w in gg.items():
            if spec[2]:
                words, scales, biases = (permute(a, n_head) if n_head else a for a in arrays)
                w.write_tensor_data(mlx_to_blocks(words, scales, biases, t))
            else:
                w.write_tensor_data(arrays[0].astype(np.float32))
        if k % 40 == 0:
            log(f"{out.name}: {k + 1}/{len(sp)} tensors")
    st.close()
    for w in gg.values():
        w.close()
    sizes = {}
    if out.exists():
        for f in out.iterdir():
            f.unlink()
        out.rmdir()
    os.replace(tmp, out)
    sizes[str(out)] = (out / "model.safetensors").stat().st_size
    for t in ggufs:
        os.replace(f"{out}.{t}.gguf.part", f"{out}.{t}.gguf")
        sizes[f"{out}.{t}.gguf"] = Path(f"{out}.{t}.gguf").stat().st_size
    return sizes


def copy_tokenizer(name, out, vocab):
    """tests/tokenizers/NAME/tokenizer{,_config}.json(.xz) into out; its ids must fit vocab."""
    src = Path(__file__).resolve().parent.parent / "tests" / "tokenizers" / name
    for f in ("tokenizer.json", "tokenizer_config.json"):
        xz = src / (f + ".xz")
        if not xz.exists():
            sys.exit(f"cuda_models: --tokenizer {name}: no {xz}")
        data = lzma.decompress(xz.read_bytes())
        if f == "tokenizer.json":
            tok = json.loads(data)
            top = max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok.get("added_tokens", []))])
            if top >= vocab:
                sys.exit(f"cuda_models: --tokenizer {name}: id {top} past the vocabulary ({vocab})")
        (Path(out) / f).write_bytes(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    ap.add_argument("--group", type=int, default=64, choices=(32, 64, 128))
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--gguf", default="", help="comma-separated GGUF twins to write beside --out: q4_0, q4_1, q8_0")
    ap.add_argument("--hidden", type=int, help="hidden size d (default: Llama-3.1-8B's)")
    ap.add_argument("--ffn", type=int, help="feed-forward size")
    ap.add_argument("--heads", type=int, help="attention heads")
    ap.add_argument("--kv-heads", type=int, help="key/value heads")
    ap.add_argument("--vocab", type=int, help="vocabulary size (BOS and EOS become its last two ids)")
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--tokenizer", help="a tests/tokenizers/ name to copy into --out (llama3_1)")
    a = ap.parse_args()
    cfg = dict(LLAMA31_8B, num_hidden_layers=a.layers)
    for key, val in (("hidden_size", a.hidden), ("intermediate_size", a.ffn), ("num_attention_heads", a.heads),
                     ("num_key_value_heads", a.kv_heads)):
        if val:
            cfg[key] = val
    if a.vocab:
        cfg.update(vocab_size=a.vocab, bos_token_id=a.vocab - 2, eos_token_id=[a.vocab - 1])
    ggufs = [t for t in a.gguf.split(",") if t]
    for t in ggufs:
        if t not in BLOCK_BYTES:
            sys.exit(f"cuda_models: --gguf {t}: expected q4_0, q4_1 or q8_0")
    t0 = time.time()
    sizes = write_model(a.out, cfg, a.bits, a.group, ggufs, a.seed)
    if a.tokenizer:
        copy_tokenizer(a.tokenizer, a.out, cfg["vocab_size"])
    for path, n in sizes.items():
        print(f"{path}: {n / 2**20:.1f} MiB")
    print(f"{a.out}: {a.bits}-bit g{a.group}, {cfg['num_hidden_layers']} layers, d {cfg['hidden_size']}, "
          f"vocab {cfg['vocab_size']}; {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
