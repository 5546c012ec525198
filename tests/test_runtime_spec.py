"""tgs-runtime's spec modifiers, each alone against golden files made from a config.json
that docker 20.10 generated (tests/data/oci/docker-config.json, plus one field TGS does
not know). Regenerate the goldens with TGS_REGEN_GOLDEN=1 after a deliberate change,
and read the diff."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from tgs_runtime.runtime import spec as specmod
from tgs_runtime.runtime.spec import Request, SpecError, classify

DATA = Path(__file__).resolve().parent / "data" / "oci"
INPUT = json.loads((DATA / "docker-config.json").read_text())
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def setup(tmp: Path, cls: str = "opportunistic", sim: bool = True) -> specmod.Setup:
    return specmod.Setup(
        cls=cls, gpus=[UUID], container_dir=tmp, activity={UUID: f"/run/tgs/activity/{UUID}"},
        shim_path=Path("/usr/lib/tgs/libtgs.so"), hook_path=Path("/usr/bin/tgs-hook"),
        config_path=Path("/etc/tgs/config.toml"), hook_timeout_s=10,
        sim_state=Path("/dev/shm/simgpu.state") if sim else None,
        sim_lib_dir=Path("/usr/lib/tgs/simgpu-host") if sim else None,
        preload_lines=["/usr/lib/libimage.so"])


def normalise(spec: dict, tmp: Path) -> dict:
    return json.loads(json.dumps(spec).replace(str(tmp), "<container-dir>"))


@pytest.mark.parametrize("modifier", specmod.MODIFIERS, ids=lambda m: m.__name__)
def test_each_modifier_against_its_golden_file(modifier, tmp_path):
    out = normalise(modifier(copy.deepcopy(INPUT), setup(tmp_path)), tmp_path)
    golden = DATA / "golden" / f"{modifier.__name__}.json"
    if os.environ.get("TGS_REGEN_GOLDEN"):
        golden.write_text(json.dumps(out, indent=2) + "\n")
    assert out == json.loads(golden.read_text())
    assert out["x-vendor-extension"] == {"kept": True}, "fields TGS does not know survive"


@pytest.mark.parametrize("modifier", specmod.MODIFIERS, ids=lambda m: m.__name__)
def test_modifiers_do_not_touch_their_input(modifier, tmp_path):
    before = copy.deepcopy(INPUT)
    applied = specmod.apply(INPUT, setup(tmp_path))
    assert INPUT == before
    snapshot = copy.deepcopy(applied)
    modifier(applied, setup(tmp_path))  # again, on a spec that has every part it changes
    assert applied == snapshot, f"{modifier.__name__} changed its input"


def test_applying_twice_is_applying_once(tmp_path):
    once = specmod.apply(INPUT, setup(tmp_path))
    assert specmod.apply(once, setup(tmp_path)) == once


def test_the_combined_preload_keeps_the_images_own(tmp_path):
    specmod.preload(INPUT, setup(tmp_path))
    assert (tmp_path / "ld.so.preload").read_text() == "/usr/lib/tgs/libtgs.so\n/usr/lib/libimage.so\n"


def test_activity_is_read_only_for_opportunistic_and_writable_for_production(tmp_path):
    def opts(cls):
        out = specmod.mount_activity(INPUT, setup(tmp_path, cls))
        return next(m["options"] for m in out["mounts"] if m["destination"].endswith(UUID))

    assert "ro" in opts("opportunistic") and "rw" in opts("production")


def test_without_sim_no_simgpu_is_mounted(tmp_path):
    assert specmod.simgpu(INPUT, setup(tmp_path, sim=False)) == INPUT


def spec_with(env=(), annotations=None, devices=(), mounts=()):
    s = copy.deepcopy(INPUT)
    s["process"]["env"] = ["PATH=/bin", *env]
    s.pop("annotations", None)
    if annotations is not None:
        s["annotations"] = annotations
    s["linux"]["devices"] = list(devices)
    s["mounts"] += list(mounts)
    return s


def node(path: str, major: int, minor: int) -> dict:
    return {"path": path, "type": "c", "major": major, "minor": minor, "fileMode": 8630, "uid": 0, "gid": 0}


# what CDI (docker --device nvidia.com/gpu=1, containerd or CRI-O) puts in a spec for GPU 1 of a host
CDI_GPU1 = [node("/dev/nvidia1", 195, 1), node("/dev/nvidiactl", 195, 255), node("/dev/nvidia-modeset", 195, 254),
            node("/dev/nvidia-uvm", 508, 0), node("/dev/nvidia-uvm-tools", 508, 1)]
CDI_MIG = [node("/dev/nvidia0", 195, 0), node("/dev/nvidiactl", 195, 255), node("/dev/nvidia-caps/nvidia-cap21", 511, 21),
           node("/dev/nvidia-caps/nvidia-cap22", 511, 22)]
VOID = "NVIDIA_VISIBLE_DEVICES=void"
# the device plugin's volume-mounts strategy: the GPUs are mounts, named in a directory
LISTED = {"destination": "/var/run/nvidia-container-devices/GPU-abc", "type": "bind", "source": "/dev/null",
          "options": ["rbind", "ro"]}


CLASSIFY = [
    ((), None, "", None),
    (("NVIDIA_VISIBLE_DEVICES=0",), None, "", None),
    (("NVIDIA_VISIBLE_DEVICES=0",), None, "opportunistic", Request("opportunistic", ["0"])),
    (("TGS_CLASS=Production", "NVIDIA_VISIBLE_DEVICES=GPU-abc,1"), None, "", Request("production", ["GPU-abc", "1"])),
    (("TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=0"), {"tgs.class": "opportunistic"}, "",
     Request("opportunistic", ["0"])),
    (("TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=0"), {"io.kubernetes.cri.container-type": "sandbox"}, "", None),
    (("NVIDIA_VISIBLE_DEVICES=void",), None, "opportunistic", None),
    # MIG instances are isolated already: the default class leaves them alone (asked for, they are refused)
    (("NVIDIA_VISIBLE_DEVICES=MIG-4f8c2a6e-0b1d-5e7f-9a3c-2d4e6f8a0b1c",), None, "opportunistic", None),
    (("NVIDIA_VISIBLE_DEVICES=0:1,0:2",), None, "production", None),
    (("NVIDIA_VISIBLE_DEVICES=0,0:2",), None, "production", None),
    # CDI: NVIDIA_VISIBLE_DEVICES=void, the GPU is a device node (its minor number names it)
    ((VOID,), None, "opportunistic", Request("opportunistic", ["/dev/nvidia1"]), CDI_GPU1),
    (("TGS_CLASS=production", VOID), None, "", Request("production", ["/dev/nvidia1"]), CDI_GPU1),
    (("TGS_CLASS=production",), None, "", Request("production", ["/dev/nvidia3"]),
     [node("/dev/nvidia0", 195, 3)]),  # docker run --device /dev/nvidia3:/dev/nvidia0: the node is GPU 3's
    ((VOID,), None, "opportunistic", None, CDI_GPU1[1:]),  # the driver's other nodes are not a GPU
    # without CDI's void, nodes are no GPU request (a privileged container has every node of the host)
    ((), None, "opportunistic", None, CDI_GPU1),
    ((VOID,), None, "opportunistic", None, CDI_MIG),
    # NVIDIA_VISIBLE_DEVICES, when it names GPUs, is what the NVIDIA runtime acts on
    (("TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=0"), None, "", Request("production", ["0"]), CDI_GPU1),
    (("NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices",), None, "opportunistic",
     Request("opportunistic", ["GPU-abc"]), (), [LISTED]),
    # the device plugin's CDI annotations (for containerd or CRI-O, or for the NVIDIA runtime
    # in CDI mode underneath TGS, when no device node is in the spec yet)
    ((VOID,), {"cdi.k8s.io/nvidia-device-plugin_0a1b": "nvidia.com/gpu=GPU-abc"}, "opportunistic",
     Request("opportunistic", ["GPU-abc"]), CDI_GPU1),
    (("TGS_CLASS=production",), {"nvidia.cdi.k8s.io/nvidia-device-plugin_0a1b": "nvidia.com/gpu=0,nvidia.com/gpu=2"},
     "", Request("production", ["0", "2"])),
    ((VOID,), {"nvidia.cdi.k8s.io/nvidia-device-plugin_9f43": "k8s.device-plugin.nvidia.com/gpu=GPU-6550"},
     "opportunistic", Request("opportunistic", ["GPU-6550"])),  # the device plugin's own CDI kind
    ((), {"cdi.k8s.io/fpga": "example.com/fpga=0"}, "opportunistic", None),
    ((), {"cdi.k8s.io/x": "nvidia.com/gpu=gpu1,nvidia.com/gpu=gpu1"}, "opportunistic",
     Request("opportunistic", ["1"])),  # the names of toolkits before 1.14
    ((), {"cdi.k8s.io/x": "nvidia.com/gpu=mig1:0"}, "opportunistic", None),
    # the NVIDIA runtime in CDI mode takes CDI names in NVIDIA_VISIBLE_DEVICES too
    (("TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"), None, "", Request("production", ["all"])),
    ((), {"cdi.k8s.io/nvidia-device-plugin_0a1b": "nvidia.com/gpu=0:1"}, "opportunistic", None),
    ((), {"cdi.k8s.io/nvidia-device-plugin_0a1b": "k8s.device-plugin.nvidia.com/mig-1g.10gb=MIG-4f8c"},
     "opportunistic", None),
]


@pytest.mark.parametrize("env,annotations,default,want,devices,mounts", [(*c, (), ())[:6] for c in CLASSIFY])
def test_classify(env, annotations, default, want, devices, mounts):
    assert classify(spec_with(env, annotations, devices, mounts), default) == want


@pytest.mark.parametrize("env,annotations,want", [
    ((), {}, None),
    (("TGS_CONVERT_MEMORY=false",), {}, False),
    (("TGS_CONVERT_MEMORY=TRUE",), {}, True),
    (("TGS_CONVERT_MEMORY=",), {}, None),
    (("TGS_CONVERT_MEMORY=true",), {"tgs.convert-memory": "false"}, False),
], ids=["host's", "env false", "env true", "env empty", "annotation wins"])
def test_a_production_container_may_keep_its_device_memory(env, annotations, want):
    """TGS_CONVERT_MEMORY (or the tgs.convert-memory annotation) is a production
    container's own choice of [memory] convert_production: false keeps its allocations
    plain device memory, which CUDA IPC needs."""
    spec = spec_with(("TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=0", *env), annotations)
    assert classify(spec) == Request("production", ["0"], want)


def test_classify_refuses_with_reasons():
    with pytest.raises(SpecError, match="TGS_CONVERT_MEMORY='no': expected true or false"):
        classify(spec_with(("TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=0", "TGS_CONVERT_MEMORY=no")))
    with pytest.raises(SpecError, match="annotation tgs.convert-memory=false: an opportunistic container's GPU "
                                        "memory is always managed memory .* can run as production"):
        classify(spec_with(("TGS_CLASS=opportunistic", "NVIDIA_VISIBLE_DEVICES=0"), {"tgs.convert-memory": "false"}))
    with pytest.raises(SpecError, match="TGS_CLASS='batch'"):
        classify(spec_with(("TGS_CLASS=batch", "NVIDIA_VISIBLE_DEVICES=0")))
    with pytest.raises(SpecError, match="needs a GPU: set NVIDIA_VISIBLE_DEVICES .* or a CDI device"):
        classify(spec_with(("TGS_CLASS=production",)))
    with pytest.raises(SpecError, match="needs a GPU"):
        classify(spec_with(("TGS_CLASS=production", VOID), devices=CDI_GPU1[1:]))
    with pytest.raises(SpecError, match="GPU '0:1' is a MIG instance: TGS shares whole GPUs"):
        classify(spec_with(("TGS_CLASS=opportunistic", "NVIDIA_VISIBLE_DEVICES=0,0:1")))
    with pytest.raises(SpecError, match="GPU '3' is a MIG instance"):
        classify(spec_with(("TGS_CLASS=opportunistic",), {"cdi.k8s.io/x": "nvidia.com/mig-1g.10gb=3"}))
    with pytest.raises(SpecError, match="GPU /dev/nvidia0 \\(with /dev/nvidia-caps/nvidia-cap21\\) is a MIG instance"):
        classify(spec_with(("TGS_CLASS=opportunistic", VOID), devices=CDI_MIG))
    with pytest.raises(SpecError, match="needs the annotation"):
        classify(spec_with(("TGS_CLASS=production", "NVIDIA_VISIBLE_DEVICES=0")), production_policy="annotation")
    ok = classify(spec_with(("NVIDIA_VISIBLE_DEVICES=0",), {"tgs.class": "production"}), production_policy="annotation")
    assert ok == Request("production", ["0"])
