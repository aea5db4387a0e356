#!/usr/bin/python3
"""prepare_data.py — turn a text, a NumPy array of token ids or a Hugging Face dataset into the token files
fsdpc's --tokens and --val-tokens read: llm.c's .bin format (a header of 256 little-endian int32: magic
20240520, version 1 for uint16 tokens or 2 for uint32 ones, the token count; then the tokens, little-endian).

    scripts/prepare_data.py INPUT -o PREFIX [--val-fraction 0.1] [--tokenizer bytes|tiktoken:NAME|hf:NAME]

writes PREFIX_train.bin and PREFIX_val.bin (the last --val-fraction of the token stream, as nanoGPT holds
out its last tenth) and prints their counts.  INPUT is one of:
  FILE.npy                 token ids already (any integer dtype; 2-D arrays are read row by row)
  FILE (any other)         a text: one token per byte (--tokenizer bytes, the default: ids 0..255, as
                           fsdpc's demo and examples/gpt.onnx use), or a tokenizer's ids: tiktoken:gpt2
                           (the `tiktoken` package), hf:NAME (`transformers`' AutoTokenizer.from_pretrained)
  hf:NAME_OR_FILE          a Hugging Face dataset (the `datasets` package): a hub name or a local .parquet,
                           .json/.jsonl, .csv, .txt or .arrow file; --hf-split (train), --hf-column (text);
                           each row's text is tokenized, rows joined by the tokenizer's end-of-text token
                           (bytes: a blank line)
Then: ./train --tokens PREFIX_train.bin --val-tokens PREFIX_val.bin ...

Only Debian's python3 and numpy are needed for texts and .npy files; tiktoken, transformers and datasets
only when asked for (a clear message if missing).  Outputs are written atomically (a temporary created
beside, renamed over the name: a planted link is replaced, never followed); an output that is the input is
refused.  Errors: one line on stderr, exit status 2.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

MAGIC, HEADER_INTS = 20240520, 256


def fail(msg):
    sys.stderr.write("prepare_data.py: error: %s\n" % msg)
    sys.exit(2)


def need(module, what):
    """import module, or fail saying what needs it and how to install it"""
    try:
        return __import__(module)
    except ImportError:
        fail("%s needs the Python package '%s', which is not installed here (pip install %s); texts and .npy "
             "files need only numpy" % (what, module, module))


def tokenizer(spec):
    """(encode(str) -> list of ids, end-of-text id or None, description) for --tokenizer spec"""
    if spec == "bytes":
        return None, None, "one token per byte"
    kind, _, name = spec.partition(":")
    if kind == "tiktoken" and name:
        tk = need("tiktoken", "--tokenizer " + spec)
        try:
            enc = tk.get_encoding(name)
        except Exception as e:  # unknown name, or its files cannot be fetched
            fail("--tokenizer %s: %s" % (spec, str(e).splitlines()[0] if str(e) else type(e).__name__))
        return (lambda s: enc.encode_ordinary(s)), enc.eot_token, "tiktoken " + name
    if kind == "hf" and name:
        tr = need("transformers", "--tokenizer " + spec)
        try:
            tok = tr.AutoTokenizer.from_pretrained(name)
        except Exception as e:
            fail("--tokenizer %s: %s" % (spec, str(e).splitlines()[0] if str(e) else type(e).__name__))
        return (lambda s: tok.encode(s, add_special_tokens=False)), tok.eos_token_id, "transformers " + name
    fail("--tokenizer %r: expected bytes, tiktoken:NAME (e.g. tiktoken:gpt2) or hf:NAME" % spec)


def from_npy(path):
    try:
        a = np.load(path, allow_pickle=False, mmap_mode="r")
    except Exception as e:
        fail("%s: not a readable .npy file (%s)" % (path, str(e).splitlines()[0] if str(e) else type(e).__name__))
    if a.dtype.kind not in "iu":
        fail("%s: holds %s values; token ids are integers" % (path, a.dtype))
    if a.ndim == 0 or a.size == 0:
        fail("%s: holds no token ids" % path)
    a = np.asarray(a).reshape(-1)
    if a.dtype.kind == "i" and a.min() < 0:
        fail("%s: a negative token id (%d)" % (path, a.min()))
    if a.max() > 0xFFFFFFFF:
        fail("%s: token id %d does not fit 32 bits" % (path, a.max()))
    return a.astype(np.uint32)


def from_text(path, spec):
    try:
        data = open(path, "rb").read()
    except OSError as e:
        fail("%s: %s" % (path, e.strerror))
    encode, _, _ = tokenizer(spec)
    if encode is None:
        return np.frombuffer(data, np.uint8).astype(np.uint32)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail("%s: not UTF-8 text at byte %d (--tokenizer bytes reads any file)" % (path, e.start))
    return np.asarray(encode(text), np.uint32)


def from_hf(name, args):
    ds_mod = need("datasets", "a Hugging Face dataset (hf:%s)" % name)
    local = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv", ".txt": "text",
             ".arrow": "arrow"}
    ext = os.path.splitext(name)[1].lower()
    try:
        if os.path.exists(name):
            if ext not in local:
                fail("hf:%s: a local dataset file is .parquet, .json, .jsonl, .csv, .txt or .arrow" % name)
            ds = ds_mod.load_dataset(local[ext], data_files=name, split=args.hf_split)
        else:
            ds = ds_mod.load_dataset(name, split=args.hf_split)
    except SystemExit:
        raise
    except Exception as e:
        fail("hf:%s: %s" % (name, str(e).splitlines()[0] if str(e) else type(e).__name__))
    if args.hf_column not in ds.column_names:
        fail("hf:%s: no column %r (columns: %s; give --hf-column)" % (name, args.hf_column, ", ".join(ds.column_names)))
    encode, eot, _ = tokenizer(args.tokenizer)
    parts = []
    for row in ds[args.hf_column]:
        if encode is None:
            parts.append(np.frombuffer(str(row).encode("utf-8") + b"\n\n", np.uint8).astype(np.uint32))
        else:
            ids = ([eot] if eot is not None else []) + list(encode(str(row)))
            parts.append(np.asarray(ids, np.uint32))
    if not parts:
        fail("hf:%s: split %r has no rows" % (name, args.hf_split))
    return np.concatenate(parts)


def write_bin(path, tokens, version, inputs):
    """tokens as an llm.c .bin of version (1: uint16, 2: uint32) at path, atomically"""
    if tokens.size >= 2 ** 31:
        fail("%s: %d tokens: llm.c's header counts them in an int32 (split the input)" % (path, tokens.size))
    for i in inputs:
        if os.path.exists(path) and os.path.samefile(path, i):
            fail("%s is the input %s: write elsewhere" % (path, i))
    header = np.zeros(HEADER_INTS, "<i4")
    header[:3] = (MAGIC, version, tokens.size)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)  # O_EXCL: no link followed
    except OSError as e:
        fail("%s: cannot create a file in %s: %s" % (path, folder, e.strerror))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.astype("<u2" if version == 1 else "<u4").tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # replaces a link at path, never follows it
        dfd = os.open(folder, os.O_RDONLY)
        os.fsync(dfd)
        os.close(dfd)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        fail("%s: %s" % (path, e.strerror))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].split("— ")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the top of this script for the formats.")
    ap.add_argument("input", help="FILE.npy (token ids), a text FILE, or hf:NAME_OR_FILE (a Hugging Face dataset)")
    ap.add_argument("-o", "--out", required=True, help="output prefix: writes PREFIX_train.bin and PREFIX_val.bin")
    ap.add_argument("--val-fraction", type=float, default=0.1,
                    help="the last fraction of the tokens held out for validation (default 0.1; 0: no val file)")
    ap.add_argument("--tokenizer", default="bytes", help="bytes (default), tiktoken:NAME or hf:NAME (texts only)")
    ap.add_argument("--hf-split", default="train", help="the dataset split (default train)")
    ap.add_argument("--hf-column", default="text", help="the dataset column holding the text (default text)")
    ap.add_argument("--seq-len", type=int, default=0,
                    help="check that each file holds at least T + 1 tokens (one sample of the model's T)")
    args = ap.parse_args()
    if not 0 <= args.val_fraction < 1:
        fail("--val-fraction %g: expected a fraction in [0, 1)" % args.val_fraction)
    if args.seq_len < 0:
        fail("--seq-len %d: expected T >= 1" % args.seq_len)
    if args.input.startswith("hf:"):
        tokens, source = from_hf(args.input[3:], args), args.input
    elif args.input.endswith(".npy"):
        if args.tokenizer != "bytes":
            fail("--tokenizer applies to texts; %s holds token ids already" % args.input)
        tokens, source = from_npy(args.input), args.input
    else:
        tokens, source = from_text(args.input, args.tokenizer), args.input
    n = tokens.size
    n_val = int(round(n * args.val_fraction))
    if args.val_fraction > 0 and n_val == 0:
        fail("%s: %d tokens, too few to hold out %g of them" % (source, n, args.val_fraction))
    splits = [("train", tokens[:n - n_val])] + ([("val", tokens[n - n_val:])] if n_val else [])
    for name, t in splits:
        if t.size < max(args.seq_len + 1, 2):
            fail("%s: the %s split holds %d tokens; a sample of T = %d needs %d (more data, or another "
                 "--val-fraction)" % (source, name, t.size, args.seq_len, max(args.seq_len + 1, 2)))
    inputs = [args.input] if os.path.exists(args.input) else []
    print("%s: %d tokens (%s), ids 0..%d" % (source, n, "one per byte" if args.tokenizer == "bytes" and not
                                             args.input.endswith(".npy") else "ids" if args.input.endswith(".npy")
                                             else args.tokenizer, int(tokens.max())))
    v = 1 if tokens.max() < 65536 else 2  # the whole stream's: train and val share a token width
    for name, t in splits:
        path = "%s_%s.bin" % (args.out, name)
        write_bin(path, t, v, inputs)
        print("%-5s %d tokens -> %s (llm.c version %d, %s)" % (name, t.size, path, v, "uint16" if v == 1 else "uint32"))
    print("train with: --tokens %s_train.bin%s" % (args.out, " --val-tokens %s_val.bin" % args.out if n_val else ""))


if __name__ == "__main__":
    main()
