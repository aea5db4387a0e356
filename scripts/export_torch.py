"""Export a PyTorch nn.Module to ONNX for training with fsdpc, then check it with fsdpc.

usage: python3 scripts/export_torch.py SPEC.py OUT.onnx [--exporter dynamo|torchscript] [--opset N]
                                       [--fsdpc PATH] [--no-check] [-- FSDPC_ARGS...]

SPEC.py is a Python file defining
    model()            -> the torch.nn.Module (it is put in training mode here); a Hugging Face model as it is:
                          see "Outputs" below
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
as PyTorch does.  Each non-persistent buffer (register_buffer(..., persistent=False): a rotary embedding's
inv_freq) the export holds as an initializer is recorded too, key "fsdpc.non_persistent.INIT", value the
buffer's name in the module: it is no entry of the module's state_dict, so the executable's
--export-safetensors leaves it out (and says so).  A tied parameter is one initializer under one of its names;
each other name is recorded, key "fsdpc.tied.NAME", value the initializer: --export-safetensors writes the
tensor under that name too.  So a strict load_state_dict takes the file.

Outputs: the export's output must be a tensor (the loss reads it).  A module whose forward returns something else
(a Hugging Face model's ModelOutput, a tuple, a dict) is wrapped here, in place (wrap_outputs: its forward
replaced on the instance, so its parameter and buffer names stay its own): the inputs are passed by keyword when
the forward names every one of input_names (input_names defaults to the forward's first parameters then:
input_ids, pixel_values...), else by position, and the export returns the output's .logits, or else its first
tensor; the script prints which.
Importable: wrap_outputs(model, args, input_names), export(model, args, path, exporter, input_names,
output_names, opset) and check(path, ...).
"""
import argparse
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
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
NON_PERSISTENT_KEY = "fsdpc.non_persistent."
TIED_KEY = "fsdpc.tied."


def _aliases(named):
    """id(tensor) -> every name it has in named (tied weights and shared buffers have several)"""
    out = {}
    for n, t in named:
        out.setdefault(id(t), []).append(n)
    return out


def _padding_records(model, inits, path):
    """(key, value, note) for each nn.Embedding with a padding_idx: PADDING_KEY + the initializer holding its
    weight = the row"""
    aliases = _aliases(model.named_parameters(remove_duplicate=False))
    out = []
    for name, emb in model.named_modules():
        if not isinstance(emb, torch.nn.Embedding) or emb.padding_idx is None:
            continue
        found = [a for a in aliases.get(id(emb.weight), []) if a in inits]
        if not found:
            raise SystemExit("export_torch: %s's weight (an nn.Embedding with padding_idx %d) is no initializer of "
                             "%s under any of its names (%s): its padding_idx cannot be recorded"
                             % (name, emb.padding_idx, path, ", ".join(aliases.get(id(emb.weight), []))))
        out.append((PADDING_KEY + found[0], str(emb.padding_idx),
                    "%s: padding_idx %d recorded for initializer %s (fsdpc gives that row no gradient from the "
                    "lookup, as PyTorch)" % (name, emb.padding_idx, found[0])))
    return out


def _non_persistent_records(model, inits):
    """(key, value, note) for each initializer holding a non-persistent buffer (no state_dict entry):
    NON_PERSISTENT_KEY + the initializer = the buffer's name.  A buffer the exporter folded into a constant
    (TorchScript) is no initializer and needs no record."""
    names = {"%s%s%s" % (mn, "." if mn else "", b)
             for mn, m in model.named_modules(remove_duplicate=False) for b in m._non_persistent_buffers_set}
    aliases = _aliases(model.named_buffers(remove_duplicate=False))
    out = []
    for ns in aliases.values():
        if not all(n in names for n in ns):
            continue  # in the state_dict under one of its names
        for n in ns:
            if n in inits:
                out.append((NON_PERSISTENT_KEY + n, n, "%s: a non-persistent buffer (no state_dict entry), "
                            "recorded: fsdpc's --export-safetensors leaves it out" % n))
    return out


def _tied_records(model, inits):
    """(key, value, note) for each other name of a tied parameter (one initializer under one of its names):
    TIED_KEY + the other name = the initializer, so that fsdpc's --export-safetensors holds every name of the
    module's state_dict"""
    out = []
    for ns in _aliases(model.named_parameters(remove_duplicate=False)).values():
        found = [n for n in ns if n in inits]
        for n in ns if found else []:
            if n not in inits:
                out.append((TIED_KEY + n, found[0], "%s: tied to initializer %s, recorded: fsdpc's "
                            "--export-safetensors writes it under both names" % (n, found[0])))
    return out


def _record_metadata(model, path):
    """each nn.Embedding's padding_idx, each non-persistent buffer and each tied parameter's other names written
    into path's model metadata_props (PADDING_KEY, NON_PERSISTENT_KEY, TIED_KEY); returns the notes"""
    import onnx
    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    recs = _padding_records(model, inits, path) + _non_persistent_records(model, inits) + _tied_records(model, inits)
    if not recs:
        return []
    for k, v, _ in recs:
        e = m.metadata_props.add()
        e.key, e.value = k, v
    tmp = path + ".tmp"
    onnx.save(m, tmp)
    os.replace(tmp, path)
    return [note for _, _, note in recs]


def _first_tensor(out):
    """(the tensor an output stands for, where it is: ".logits", "['last_hidden_state']", "[0]"), or (None, None)"""
    if isinstance(out, torch.Tensor):
        return out, ""
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits, ".logits"
    items = list(out.items()) if isinstance(out, dict) else (
        list(enumerate(out)) if isinstance(out, (tuple, list)) else [])
    for k, v in items:
        if isinstance(v, torch.Tensor):
            return v, "[%r]" % k
    return None, None


def _pick(out, where):
    """the tensor at where (as _first_tensor names it: .logits, [0], ['out']) in a forward's output"""
    import ast
    return getattr(out, where[1:]) if where.startswith(".") else out[ast.literal_eval(where[1:-1])]


def _forward_names(model, n):
    """the first n parameter names of model's forward, or None when it takes *args"""
    ps = list(inspect.signature(model.forward).parameters.values())[:n]
    ok = len(ps) == n and all(p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in ps)
    return [p.name for p in ps] if ok else None


def _by_keyword(model, names):
    """whether model's forward names every one of names (then the inputs are passed by keyword)"""
    params = inspect.signature(model.forward).parameters
    return bool(names) and all(n in params for n in names)


def wrap_outputs(model, args, input_names=None):
    """model's forward made to return one tensor, in place, when it returns something else (a Hugging Face
    ModelOutput, a tuple, a dict): its .logits, or else its first tensor, the inputs by keyword when the forward
    names every input (input_names, default: the forward's first parameters), else by position.  The forward is
    replaced on the instance (a bound method: deepcopy rebinds it), so every parameter and buffer keeps its own
    name.  Returns (input_names to export with, a note or None); one forward call decides, the RNG state and the
    buffers kept."""
    names = list(input_names) if input_names else _forward_names(model, len(args))
    kw = _by_keyword(model, names)
    saved = [b.detach().clone() for b in model.buffers()]  # a training-mode forward updates BatchNorm's
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        out = model(**dict(zip(names, args))) if kw else model(*args)
        for b, v in zip(model.buffers(), saved):
            b.copy_(v)
    if isinstance(out, torch.Tensor):
        return input_names, None
    t, where = _first_tensor(out)
    if t is None:
        raise SystemExit("export_torch: %s's forward returns %s, with no tensor in it: return the tensor the loss "
                         "reads" % (type(model).__name__, type(out).__name__))
    bound = tuple(names) if kw else None

    def forward(self, *a):
        o = type(self).forward(self, **dict(zip(bound, a))) if bound else type(self).forward(self, *a)
        return _pick(o, where)

    model.forward = types.MethodType(forward, model)
    how = "by keyword: " + ", ".join(names) if kw else "by position"
    note = ("%s returns %s: the export returns its %s %s (inputs %s)"
            % (type(model).__name__, type(out).__name__, where if where.startswith(".") else "first tensor " + where,
               list(t.shape), how))
    return (names if kw else input_names), note


def export(model, args, path, exporter="dynamo", input_names=None, output_names=("logits",), opset=None):
    """model (put in training mode; its forward made to return one tensor: wrap_outputs) exported to path for
    fsdpc training; returns a list of notes"""
    model.train()
    args = tuple(args)
    input_names, wrapped = wrap_outputs(model, args, input_names)
    input_names = list(input_names or ["x%d" % i for i in range(len(args))])
    output_names = list(output_names)
    notes = [wrapped] if wrapped else []
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
    return notes + _record_metadata(model, path)


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
    aliases = _aliases(model.named_parameters(remove_duplicate=False))  # tied weights have several names
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
