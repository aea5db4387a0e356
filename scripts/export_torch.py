"""Export a PyTorch nn.Module to ONNX for training with fsdpc, then check it with fsdpc.

usage: python3 scripts/export_torch.py SPEC.py OUT.onnx [--exporter dynamo|torchscript] [--opset N]
                                       [--fsdpc PATH] [--no-check] [-- FSDPC_ARGS...]

SPEC.py is a Python file defining
    model()            -> the torch.nn.Module (it is put in training mode here)
    example_inputs()   -> a tuple of tensors: one call's inputs (their shapes are exported as they are: the
                          batch dimension is the per-rank batch fsdpc's executable is built for)
and optionally
    input_names        -> a list of names for the graph inputs (default x0, x1, ...)
    output_names       -> a list of names for the graph outputs (default ["logits"])
    fsdpc_args         -> a list of fsdpc flags for the check, e.g. ["--loss", "cross_entropy:logits,labels"]
                          (FSDPC_ARGS after "--" are added to them)

Then runs `fsdpc OUT.onnx --target cpu --report ...` and `--dump-after units`, and prints which initializers
fsdpc trains, beside the module's parameters and buffers: every parameter should be trained (a tied one, e.g.
GPT-2's lm_head = wte, under one of its names), no buffer, and no frozen parameter (requires_grad False: the check
compiles with --freeze NAME for each, and says to).

Exporters (torch >= 2.6; see README "Exporting a model for training"):
  dynamo       torch.onnx.export(model, args, f, dynamo=True, optimize=False, ...)
               optimize=False keeps every parameter its own named initializer.  onnxscript writes every
               BatchNormalization in inference form (no training_mode) even from a module in training mode;
               when the exported program's batch norms are all in training mode, this script sets
               training_mode=1 on every BatchNormalization node (and says so); a mix is refused.
  torchscript  torch.onnx.export(model, args, f, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                                 do_constant_folding=False, ...)
Both: each nn.Embedding with a padding_idx has it recorded in the file's model metadata_props, key
"fsdpc.padding_idx.INIT" (INIT: the initializer holding its weight, under one of its names when tied), value the
row: neither exporter keeps padding_idx, and fsdpc reads the key to give that row no gradient from the lookup,
as PyTorch does.
Importable: export(model, args, path, exporter, input_names, output_names, opset) and check(path, ...).
"""
import argparse
import importlib.util
import os
import re
import subprocess
import sys
import warnings

import torch


def _bn_training_counts(exported_program):
    """(training, inference) batch norms in a torch.export program"""
    train = infer = 0
    for n in exported_program.graph.nodes:
        t = str(n.target)
        if "_native_batch_norm_legit_no_training" in t or "_native_batch_norm_legit_no_stats" in t:
            infer += 1
        elif "_native_batch_norm_legit_functional" in t or "batch_norm" in t and "aten" in t:
            training = n.args[5] if len(n.args) > 5 else True
            if training:
                train += 1
            else:
                infer += 1
    return train, infer


def _set_bn_training(path, n_train):
    import onnx
    from onnx import helper
    m = onnx.load(path)
    bns = [n for n in m.graph.node if n.op_type == "BatchNormalization"]
    if len(bns) != n_train:
        raise SystemExit("export_torch: %d BatchNormalization nodes in %s, %d training-mode batch norms in the "
                         "exported program: use --exporter torchscript" % (len(bns), path, n_train))
    for n in bns:
        for a in list(n.attribute):
            if a.name == "training_mode":
                n.attribute.remove(a)
        n.attribute.append(helper.make_attribute("training_mode", 1))
    tmp = path + ".tmp"
    onnx.save(m, tmp)
    os.replace(tmp, path)
    return len(bns)


PADDING_KEY = "fsdpc.padding_idx."


def _record_padding(model, path):
    """each nn.Embedding's padding_idx written into path's model metadata_props (PADDING_KEY + the initializer
    holding its weight = the row); returns the notes"""
    embs = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None]
    if not embs:
        return []
    import onnx
    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    aliases = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    notes = []
    for name, emb in embs:
        found = [a for a in aliases.get(id(emb.weight), []) if a in inits]
        if not found:
            raise SystemExit("export_torch: %s's weight (an nn.Embedding with padding_idx %d) is no initializer of "
                             "%s under any of its names (%s): its padding_idx cannot be recorded"
                             % (name, emb.padding_idx, path, ", ".join(aliases.get(id(emb.weight), []))))
        e = m.metadata_props.add()
        e.key, e.value = PADDING_KEY + found[0], str(emb.padding_idx)
        notes.append("%s: padding_idx %d recorded for initializer %s (fsdpc gives that row no gradient from the "
                     "lookup, as PyTorch)" % (name, emb.padding_idx, found[0]))
    tmp = path + ".tmp"
    onnx.save(m, tmp)
    os.replace(tmp, path)
    return notes


def export(model, args, path, exporter="dynamo", input_names=None, output_names=("logits",), opset=None):
    """model (put in training mode) exported to path for fsdpc training; returns a list of notes"""
    model.train()
    args = tuple(args)
    input_names = list(input_names or ["x%d" % i for i in range(len(args))])
    output_names = list(output_names)
    notes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            kw = {} if opset is None else {"opset_version": opset}
            prog = torch.onnx.export(model, args, None, dynamo=True, optimize=False, input_names=input_names,
                                     output_names=output_names, **kw)
            train, infer = _bn_training_counts(prog.exported_program)
            prog.save(path)
            if train and infer:
                raise SystemExit("export_torch: batch norms in both training (%d) and inference (%d) mode: "
                                 "use --exporter torchscript" % (train, infer))
            if train:
                notes.append("BatchNormalization: %d nodes set to training_mode=1 (onnxscript writes them in "
                             "inference form)" % _set_bn_training(path, train))
        elif exporter == "torchscript":
            kw = {} if opset is None else {"opset_version": opset}
            torch.onnx.export(model, args, path, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                              do_constant_folding=False, input_names=input_names, output_names=output_names,
                              **kw)
        else:
            raise SystemExit("export_torch: --exporter %s: dynamo or torchscript" % exporter)
    return notes + _record_padding(model, path)


def trained_names(fsdpc, path, fsdpc_args):
    """(the initializers fsdpc trains, its --report text); exits with fsdpc's message when it refuses"""
    base = [fsdpc, path, "--target", "cpu"] + list(fsdpc_args)
    p = subprocess.run(base + ["--report"], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("fsdpc refuses %s:\n%s" % (path, (p.stderr or p.stdout).strip()))
    d = subprocess.run(base + ["--dump-after", "units"], capture_output=True, text=True)
    if d.returncode != 0:
        raise SystemExit("fsdpc refuses %s:\n%s" % (path, (d.stderr or d.stdout).strip()))
    names = re.findall(r'^\s+%\d+ \S+ param "((?:[^"\\]|\\.)*)"', d.stdout, re.M)
    return names, p.stdout


def frozen_names(model):
    """the parameters PyTorch does not train (requires_grad False): fsdpc keeps them fixed with --freeze NAME"""
    return [n for n, p in model.named_parameters() if not p.requires_grad]


def freeze_args(model):
    return [a for n in frozen_names(model) for a in ("--freeze", n)]


def check(model, path, fsdpc="fsdpc", fsdpc_args=()):
    """runs fsdpc's report on path (with --freeze for each frozen parameter) and prints what it trains against
    model's parameters and buffers; returns True when every trainable parameter (under one of its names, when
    tied: GPT-2's lm_head is wte) and no buffer or frozen parameter is trained"""
    frozen = frozen_names(model)
    names, report = trained_names(fsdpc, path, list(fsdpc_args) + freeze_args(model))
    print(report.rstrip())
    trained = set(names)
    aliases = {}  # a parameter's names: tied weights have several
    for n, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(n)
    params = dict(model.named_parameters())
    every = {n for ns in aliases.values() for n in ns}
    buffers = {n for n, b in model.named_buffers() if b.is_floating_point()}
    missing = [n for n, p in params.items() if p.requires_grad and not trained & set(aliases[id(p)])]
    extra = [n for n in names if n not in every]
    bad_frozen = [n for n in frozen if trained & set(aliases[id(params[n])])]
    bad_buffers = [n for n in extra if n in buffers]
    print("fsdpc trains %d initializers (%d elements in the module's %d parameters)"
          % (len(names), sum(p.numel() for n, p in params.items() if trained & set(aliases[id(p)])), len(params)))
    for n, p in params.items():
        tied = [a for a in aliases[id(p)] if a != n]
        if tied:
            print("  tied: %s is %s (one parameter, trained once)" % (n, ", ".join(tied)))
    for n in frozen:
        print("  frozen (requires_grad False): %s, kept fixed with --freeze %s" % (n, n))
    for n in missing:
        print("  NOT TRAINED: parameter %s (not an initializer of that name, or no gradient reaches it)" % n)
    for n in extra:
        print("  TRAINED, not a parameter%s: %s" % (" (a buffer!)" if n in bad_buffers else "", n))
    for n in bad_frozen:
        print("  TRAINED, though frozen: %s" % n)
    ok = not missing and not bad_buffers and not bad_frozen
    print(("OK: every parameter is trained under its own name (a tied one under one of them)" if ok
           else "CHECK the lines above")
          + ("; compile with " + " ".join(freeze_args(model)) if frozen and ok else ""))
    return ok


def load_spec(path):
    spec = importlib.util.spec_from_file_location("fsdpc_model_spec", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for f in ("model", "example_inputs"):
        if not callable(getattr(mod, f, None)):
            raise SystemExit("export_torch: %s defines no %s()" % (path, f))
    return mod


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec", help="a Python file defining model() and example_inputs()")
    ap.add_argument("out", help="the ONNX file to write")
    ap.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo")
    ap.add_argument("--opset", type=int, default=None, help="default: the exporter's")
    ap.add_argument("--fsdpc", default=os.environ.get("FSDPC", "fsdpc"), help="the fsdpc binary (or $FSDPC)")
    ap.add_argument("--no-check", action="store_true", help="export only")
    a = ap.parse_args(argv)
    spec = load_spec(a.spec)
    model = spec.model()
    inputs = spec.example_inputs()
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    notes = export(model, inputs, a.out, a.exporter, getattr(spec, "input_names", None),
                   getattr(spec, "output_names", ["logits"]), a.opset)
    print("wrote %s (%s)" % (a.out, a.exporter))
    for n in notes:
        print("  " + n)
    if a.no_check:
        return
    ok = check(model, a.out, a.fsdpc, list(getattr(spec, "fsdpc_args", [])) + extra)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
