"""The fuzz run's mutations of what is not an HDF5 file: case files (docs/CASES.md) and the
Hugging Face configs they name, given to `dsv32 golden --spec`; and the one candidate mutation
that must never pass wherever it lands, a malformed top-k row in any layer (F or S)."""
import json
import os

import numpy as np

# Small registry cases (one of each config family) and a Hugging Face config made small by the
# case's own overrides, so that a mutation that stays valid generates in well under a second.
CASE_BASES = ["kv-fp8", "fs-pattern", "hadamard-on", "odd-block", "padded"]
HF_SMALL = {"num_layers": 2, "hidden_size": 64, "num_heads": 2, "q_lora_rank": 32,
            "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
            "index_n_heads": 2, "index_head_dim": 128, "index_topk": 8}
# Values of every JSON type, and numbers at and past every bound a reader could wrap at.
ODD_VALUES = [None, True, False, "", "7", "x" * 300, [], [1, 2], {}, {"type": "yarn"}, 0, -1,
              1.5, 2**31, 2**63, 10**19, 1e19, -1e19, 1e308, 4.9e-324]


def _paths(value, path=()):
    """Every (path, value) inside a JSON value, the root included."""
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, path + (i,))


def _set(root, path, value):
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def _mutate_json(rng, doc):
    """One mutation of a parsed JSON document, as text; returns (text, description)."""
    paths = [p for p, _ in _paths(doc) if p]
    path = rng.choice(paths)
    where = ".".join(map(str, path))
    kind = rng.randrange(8)
    if kind == 0:
        value = rng.choice(ODD_VALUES)
        _set(doc, path, value)
        return json.dumps(doc), f"{where} = {json.dumps(value)[:40]}"
    if kind == 1:
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        del parent[path[-1]]
        return json.dumps(doc), f"{where} deleted"
    if kind == 2:
        depth = rng.choice([65, 1000, 100000])
        _set(doc, path, "@DEEP@")
        return (json.dumps(doc).replace('"@DEEP@"', "[" * depth + "]" * depth),
                f"{where} nested {depth} deep")
    if kind == 3:  # a key given twice, the second value another type
        text = json.dumps(doc)
        return text[:-1] + ', "name": 5}' if text.endswith("}") else text, "root key given twice"
    if kind == 4:
        text = json.dumps(doc)
        cut = rng.randrange(len(text))
        return text[:cut], f"cut at {cut} of {len(text)} bytes"
    if kind == 5:
        text = bytearray(json.dumps(doc).encode())
        for _ in range(rng.randint(1, 4)):
            text[rng.randrange(len(text))] = rng.choice(b'{}[]",:0\\\x00\xff')
        return text.decode(errors="replace"), "bytes flipped"
    if kind == 6:
        _set(doc, path, {"unknown": 1})
        return json.dumps(doc), f"{where} an object of an unknown key"
    value = rng.choice([float("nan"), float("inf")])
    _set(doc, path, value)
    return json.dumps(doc), f"{where} = {value} (not JSON)"


def case_file_mutation(rng, fixtures, hf_dir, scratch, index):
    """A mutated case file in scratch (and, for a Hugging Face based case, its mutated config);
    returns (case file path, description)."""
    case_path = os.path.join(scratch, f"case{index}.json")
    if rng.random() < 0.6:
        base = rng.choice(CASE_BASES)
        with open(os.path.join(fixtures, "cases", base + ".json")) as f:
            doc = json.load(f)
        doc["name"] = f"case{index}"
        text, desc = _mutate_json(rng, doc)
        desc = f"case file {base}: {desc}"
    else:
        base = rng.choice(sorted(os.listdir(hf_dir)))
        with open(os.path.join(hf_dir, base)) as f:
            hf_text, hf_desc = _mutate_json(rng, json.load(f))
        hf_path = os.path.join(scratch, f"case{index}.hf.json")
        with open(hf_path, "w") as f:
            f.write(hf_text)
        text = json.dumps({"name": f"case{index}",
                           "config": {"hf_config": hf_path, **HF_SMALL},
                           "steps": [{"requests": [{"id": 0, "new_tokens": 12}]},
                                     {"requests": [{"id": 0, "new_tokens": 1}]}]})
        desc = f"Hugging Face config {base}: {hf_desc}"
    with open(case_path, "w") as f:
        f.write(text)
    return case_path, desc


def malformed_topk_row(rng, f, golden):
    """Makes one top-k row of a random layer (F or S) malformed in candidate file `f`, where the
    golden's step has a row that can be: a position after the -1 that ends its set, a -2, or a
    position chosen twice. Returns the description, or None where no row fits."""
    spots = []
    for s, step in enumerate(golden.steps):
        for name in step.expected:
            if not name.endswith("/topk"):
                continue
            rows = step.expected[name]
            for t in range(rows.shape[0]):
                k_t = int((rows[t] >= 0).sum())
                spots.append((s, name, t, k_t, rows.shape[1]))
    rng.shuffle(spots)
    for s, name, t, k_t, K in spots:
        d = f[f"steps/step{s}/expected/{name}"]
        rows = d[()].astype(np.int64)
        if k_t + 1 < K:
            how = rng.choice(["after -1", "-2"])
            rows[t, k_t + 1] = rows[t, 0] if how == "after -1" else -2
        elif k_t < K:
            how = "-2"
            rows[t, k_t] = -2
        elif k_t >= 2:
            how = "twice"
            rows[t, 1] = rows[t, 0]
        else:
            continue
        del f[f"steps/step{s}/expected/{name}"]
        f.create_dataset(f"steps/step{s}/expected/{name}", data=rows.astype(np.int32))
        f[f"steps/step{s}/expected/{name}"].attrs["dtype"] = "int32"
        return f"step{s} {name} row {t}: a position {how}"
    return None


def refused_or_whole(rc, out_dir):
    """The problem with a `golden --spec` run into out_dir, or "": a refusal leaves no golden and
    no temporary file; a success leaves every file its manifest names."""
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    if any(n.endswith(".tmp") for n in names):
        return f"a temporary file was left: {names}"
    if rc == 2 and any(n.endswith(".h5") for n in names):
        return f"refused, yet a golden was written: {names}"
    if rc == 0:
        try:
            with open(os.path.join(out_dir, "MANIFEST.json")) as f:
                listed = [e["file"] for e in json.load(f)["cases"]]
        except (OSError, ValueError, KeyError) as e:
            return f"exit 0 without a whole manifest: {e}"
        missing = [n for n in listed if n not in names]
        if missing:
            return f"the manifest names files that are not there: {missing}"
    return ""

