"""Checks `dhp export` output against the trainers' own definitions.

usage: check_export.py megatron|deepspeed|torchtitan EXPORT.json [TOML]
  megatron:   every --flag of "args" is an option of Megatron-LM's argument parser
              (tests/data/trainers/megatron-core_v0.15.0-args.txt, read from its source)
              and every grid spec field is one of Megatron Core MIMO's ModuleGridSpec
              (examples/mimo/training/topology.py at NVIDIA/Megatron-LM d98e8a64:
              name, num_ranks, tp, cp, pp, ep, gtp_remat, rank_offset, expt_tp, expt_gtp_remat)
  deepspeed:  each module's config passes DeepSpeed's own DeepSpeedConfig (installed
              package; its pydantic sub-configs forbid unknown keys), with that module's
              data-parallel size
  torchtitan: the TOML loads through torchtitan's own ConfigManager (torchtitan 0.2.2,
              which refuses unknown fields), and its values are the export's
Prints one line per failure and exits 1 if any."""
import json
import os
import sys
import types

MIMO_GRID_FIELDS = {"name", "num_ranks", "tp", "cp", "pp", "ep", "gtp_remat", "rank_offset", "expt_tp",
                    "expt_gtp_remat"}


def megatron(doc):
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "data/trainers/megatron-core_v0.15.0-args.txt")) as f:
        known = {l.strip() for l in f if l.startswith("--")}
    bad = [a for a in doc["args"] if a.startswith("--") and a not in known]
    for a in bad:
        print(f"megatron: {a} is not an argument of Megatron-LM core_v0.15.0")
    for g in doc["mimo_module_grid_specs"]:
        extra = set(g) - MIMO_GRID_FIELDS
        if extra:
            print(f"megatron: ModuleGridSpec has no field {sorted(extra)}")
            bad.append(g)
    return not bad


def deepspeed(doc):
    import deepspeed.runtime.config as dsc

    class Mpu:  # the module's data-parallel group, as Megatron-style mpu objects report it
        def __init__(self, dp):
            self.dp = dp

        def get_data_parallel_world_size(self):
            return self.dp

    ok = True
    for m in doc["modules"]:
        # No process group here: DeepSpeedConfig asks dist for the rank first.
        dsc.dist.get_rank = lambda: 0
        dsc.dist.get_world_size = lambda n=m["ranks"]: n
        try:
            c = dsc.DeepSpeedConfig(m["config"], mpu=Mpu(m["data_parallel_size"]))
            want = m["config"]
            assert c.train_batch_size == want["train_batch_size"]
            assert c.zero_optimization_stage == want["zero_optimization"]["stage"]
        except Exception as e:  # noqa: BLE001 - report what DeepSpeed said
            print(f"deepspeed: module {m['module']}: {type(e).__name__}: {str(e).splitlines()[0]}")
            ok = False
    return ok


def torchtitan(doc, toml_path):
    import importlib.util
    # torchtitan/__init__.py pulls in torch.distributed.tensor (torch 2); its
    # config package needs only torch and tyro, so load it on its own.
    spec = importlib.util.find_spec("torchtitan")
    if spec is None:
        print("torchtitan: the package is not installed (make deps)")
        return False
    root = list(spec.submodule_search_locations)[0]
    pkg = types.ModuleType("torchtitan")
    pkg.__path__ = [root]
    sys.modules["torchtitan"] = pkg
    from torchtitan.config.manager import ConfigManager
    try:
        cfg = ConfigManager().parse_args(["--job.config_file", toml_path])
    except Exception as e:  # noqa: BLE001
        print(f"torchtitan: {type(e).__name__}: {str(e).splitlines()[0]}")
        return False
    ok = True
    for section, kv in doc["toml"].items():
        node = cfg
        for part in section.split("."):   # a dotted table: [quantize.linear.float8]
            node = getattr(node, part)
        for k, v in kv.items():
            got = getattr(node, k)
            if got != v:
                print(f"torchtitan: {section}.{k} = {got!r}, export says {v!r}")
                ok = False
    return ok


def main():
    trainer, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = json.load(f)
    if doc.get("trainer") != trainer:
        print(f"{path}: trainer {doc.get('trainer')!r}, expected {trainer!r}")
        return 1
    ok = megatron(doc) if trainer == "megatron" else deepspeed(doc) if trainer == "deepspeed" \
        else torchtitan(doc, sys.argv[3])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
