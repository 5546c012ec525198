"""docker run --runtime=tgs end to end: a private dockerd, tgsd and simgpu, no GPU."""
from __future__ import annotations

import json
import time

import pytest

from harness.hostgpu import HostGpu, gpu_node, share_one_gpu_through_docker
from tgs_runtime import sim
from tgs_runtime.childd import own_config
from tgs_runtime.privatedocker import AS_INSTALLED, IMAGE, PRELOAD_IMAGE
from tgs_runtime.workload import Workload, summary

pytestmark = pytest.mark.docker


def run_args(*extra: str, runtime: str = "tgs") -> list[str]:
    return ["run", "--rm", "--network", "none", f"--runtime={runtime}", *extra]


def workload(w: Workload) -> list[str]:
    return ["tgs-workload", *w.args()]


def test_production_and_opportunistic_containers_share_one_gpu(docker, simgpu):
    d, t = docker()
    half = Workload.with_duty(0.5, period_ms=20, kernels=10, seconds=9, report_s=0.5)
    hog = Workload(kernel_us=1000, kernels=10, seconds=9, report_s=0.5)
    solo = d.docker(*run_args("-e", "TGS_CLASS=production", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e",
                              "SIMGPU_LABEL=solo", IMAGE),
                    *workload(Workload.with_duty(0.5, seconds=3, report_s=0.5)))
    alone = summary(solo.stdout).iterations_per_s
    p = d.popen(*run_args("-e", "TGS_CLASS=production", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", "SIMGPU_LABEL=prod",
                          IMAGE), *workload(half))
    o = d.popen(*run_args("-e", "TGS_CLASS=opportunistic", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e",
                          "SIMGPU_LABEL=opp", IMAGE), *workload(hog))
    simgpu.wait_for_contexts(["prod", "opp"], timeout=30)
    time.sleep(3)
    before = simgpu.status()
    classes = {c["class"] for c in t.status()["gpus"][0]["containers"]}
    time.sleep(4)
    shared = sim.busy_between(before, simgpu.status())
    pout, perr = p.communicate(timeout=60)
    oout, oerr = o.communicate(timeout=60)
    assert p.returncode == 0 and o.returncode == 0, perr + oerr
    assert classes == {"production", "opportunistic"}
    prod_rate = summary(pout).iterations_per_s
    assert prod_rate >= 0.9 * alone, f"production {prod_rate:.1f}/s beside opportunistic, {alone:.1f}/s alone"
    assert shared["opp"] / 4 >= 0.3, f"opportunistic got {shared['opp'] / 4:.2f} of the engine"
    time.sleep(0.5)
    assert t.status()["gpus"][0]["containers"] == [], "both containers were deregistered"


def _normalised_view(d, runtime: str, *extra: str) -> dict:
    out = d.docker(*run_args(*extra, IMAGE, runtime=runtime), "sh", "-c",
                   "cat /proc/self/mounts; echo ---; env | sort; echo ---; ls /etc; echo ---; maps")
    mounts, env, etc, maps = out.stdout.split("---\n")
    return {"mounts": [" ".join(l.split()[1:3]) for l in mounts.splitlines() if not l.startswith("overlay")],
            "env": sorted(l for l in env.splitlines() if not l.startswith("HOSTNAME=")),
            "etc": etc.split(), "maps": maps}


@pytest.mark.parametrize("extra", [(), ("-e", "NVIDIA_VISIBLE_DEVICES=0")], ids=["plain", "gpu-no-class"])
def test_containers_that_do_not_ask_for_tgs_are_untouched(docker, extra):
    d, t = docker()
    plain = _normalised_view(d, "runc", *extra)
    via_tgs = _normalised_view(d, "tgs", *extra)
    assert via_tgs == plain
    assert "libtgs" not in via_tgs["maps"] and "ld.so.preload" not in via_tgs["etc"]
    assert t.status()["gpus"][0]["containers"] == []


def test_a_default_class_makes_gpu_containers_tgs_containers(docker):
    d, t = docker('[runtime]\ndefault_class = "opportunistic"\n')
    out = d.docker(*run_args("-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE), "sh", "-c", "echo $TGS_CLASS; maps")
    assert out.stdout.splitlines()[0] == "opportunistic" and "/usr/lib/tgs/libtgs.so" in out.stdout
    plain = d.docker(*run_args(IMAGE), "sh", "-c", "echo class=$TGS_CLASS")
    assert plain.stdout.strip() == "class=", "no GPU, no TGS"


@pytest.mark.parametrize("gpus,visible", [("all", "all"), ('"device=0"', "0")])
def test_docker_gpus_flag_gives_a_tgs_container_its_gpu(docker, gpus, visible):
    """`docker run --gpus` under runc (no NVIDIA runtime): dockerd sets NVIDIA_VISIBLE_DEVICES
    and adds the NVIDIA Container Toolkit's prestart hook (a stand-in here); TGS takes the
    GPU from the former and keeps the latter."""
    d, t = docker()
    records = d.workdir / "nvidia-hook-records"
    before = set(records.iterdir())
    out = d.docker(*run_args("--gpus", gpus, "-e", "TGS_CLASS=opportunistic", IMAGE), "sh", "-c",
                   "cat /etc/hostname; echo $NVIDIA_VISIBLE_DEVICES; echo $TGS_CLASS; maps")
    host, seen, cls = out.stdout.split()[:3]
    assert (seen, cls) == (visible, "opportunistic") and "/usr/lib/tgs/libtgs.so" in out.stdout
    reserved = [e for e in t.events() if e.get("event") == "container reserved" and e["container"].startswith(host)]
    assert len(reserved) == 1 and reserved[0]["cls"] == "opportunistic"
    ran = [json.loads(f.read_text()) for f in set(records.iterdir()) - before]
    assert [s["id"] for s in ran] == [reserved[0]["container"]], "the NVIDIA hook ran, once"


@pytest.mark.parametrize("asked", ["TGS_CLASS", "default_class"])
def test_a_gpu_device_node_gives_a_tgs_container_its_gpu(docker, simgpu, tmp_path, asked):
    """The GPU as a device node in the spec beside NVIDIA_VISIBLE_DEVICES=void, as CDI gives
    it (docker 25+ --device nvidia.com/gpu=0, containerd, CRI-O): a node of the NVIDIA
    driver's major, made here, stands in for GPU 0's /dev/nvidia0."""
    node = gpu_node(tmp_path)
    d, t = docker('[runtime]\ndefault_class = "opportunistic"\n' if asked == "default_class" else "")
    env = ["-e", "TGS_CLASS=opportunistic"] if asked == "TGS_CLASS" else []
    out = d.docker(*run_args("--device", f"{node}:/dev/nvidia0", "-e", "NVIDIA_VISIBLE_DEVICES=void", *env, IMAGE),
                   "sh", "-c", "cat /etc/hostname; echo $TGS_CLASS; stat -c %t:%T /dev/nvidia0; maps")
    host, cls, numbers = out.stdout.split()[:3]
    assert (cls, numbers) == ("opportunistic", "c3:0") and "/usr/lib/tgs/libtgs.so" in out.stdout
    reserved = [e for e in t.events() if e.get("event") == "container reserved" and e["container"].startswith(host)]
    assert len(reserved) == 1 and reserved[0]["cls"] == "opportunistic" and reserved[0]["gpus"] == simgpu.uuids()


def test_a_default_class_leaves_a_bare_gpu_node_alone(docker, tmp_path):
    """`docker run --device /dev/nvidia0` alone, as in a privileged container (every node of
    the host): no GPU request for the default class, so the container is untouched."""
    node = gpu_node(tmp_path)
    d, t = docker('[runtime]\ndefault_class = "opportunistic"\n')
    out = d.docker(*run_args("--device", f"{node}:/dev/nvidia0", IMAGE), "sh", "-c", "echo class=$TGS_CLASS; maps")
    assert out.stdout.splitlines()[0] == "class=" and "libtgs" not in out.stdout
    assert t.status()["gpus"][0]["containers"] == []


def test_containers_given_a_gpu_as_cdi_gives_it_share_it(simgpu, libshim, c_programs, tmp_path):
    """The body of test_docker_runs_tgs_containers_on_a_real_gpu (test_real_gpu.py), on
    simgpu: a GPU node with the driver's library mounted beside NVIDIA_VISIBLE_DEVICES=void,
    a production and an opportunistic container sharing it through a private dockerd."""
    config = own_config(sim.SimSettings(state=simgpu.state))
    share_one_gpu_through_docker(HostGpu.simulated(simgpu, tmp_path), config, libshim, c_programs("maps.c"), tmp_path)


def test_the_runtime_as_set_up_for_the_default_config_runs_tgs_containers(docker):
    """daemon.json's tgs runtime without runtimeArgs, as `tgs setup docker` writes it for
    /etc/tgs/config.toml: the launcher finds its config without being told (here in
    dockerd's TGS_CONFIG), and a TGS container is set up and released, another untouched."""
    d, t = docker()
    out = d.docker(*run_args("-e", "TGS_CLASS=opportunistic", "-e", "NVIDIA_VISIBLE_DEVICES=0", runtime=AS_INSTALLED),
                   IMAGE, "sh", "-c", "echo $TGS_CLASS $TGS_DIR; ls /run/tgs").stdout.split()
    assert out[:2] == ["opportunistic", "/run/tgs"] and "control" in out
    assert d.docker(*run_args(runtime=AS_INSTALLED), IMAGE, "sh", "-c", "echo ${TGS_DIR:-none}").stdout.split() == ["none"]
    deadline = time.monotonic() + 10
    while t.status()["gpus"][0]["containers"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert t.status()["gpus"][0]["containers"] == []


def test_docker_kill_deregisters(docker):
    d, t = docker()
    cid = d.docker("run", "-d", "--network", "none", "--runtime=tgs", "-e", "TGS_CLASS=opportunistic", "-e",
                   "NVIDIA_VISIBLE_DEVICES=0", IMAGE, "sleep", "60").stdout.strip()
    assert [c["id"] for c in t.status()["gpus"][0]["containers"]] == [cid]
    assert t.container(cid)["phase"] == "attached"
    cdir = t.state_dir / "c" / cid
    assert cdir.exists()
    d.docker("kill", cid)
    deadline = time.monotonic() + 10
    while t.status()["gpus"][0]["containers"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert t.status()["gpus"][0]["containers"] == [] and not cdir.exists()
    d.docker("rm", "-f", cid, check=False)


def test_a_process_started_by_docker_exec_is_shared_too(docker, simgpu):
    """A job started with `docker exec` in a running TGS container (a common way to run
    training) gets the shim and the container's place in tgsd, though docker gives it the
    image's environment, not the one tgs-runtime wrote into the spec: the shim is in the
    container's /etc/ld.so.preload and finds its control block at /run/tgs. Only the
    simulated driver's own settings are passed on (a real driver needs none)."""
    d, t = docker()
    cid = d.docker("run", "-d", "--network", "none", "--runtime=tgs", "-e", "TGS_CLASS=opportunistic", "-e",
                   "NVIDIA_VISIBLE_DEVICES=0", IMAGE, "sleep", "60").stdout.strip()
    assert t.container(cid)["processes"] == 0
    sim_env = "export $(tr '\\0' '\\n' < /proc/1/environ | grep -E '^(SIMGPU_|LD_LIBRARY_PATH=)')"
    job = " ".join(workload(Workload(kernel_us=1000, kernels=10, seconds=4, report_s=0.5)))
    e = d.popen("exec", "-e", "SIMGPU_LABEL=exec", cid, "sh", "-c", f"{sim_env}; env | grep -c ^TGS_DIR=; {job}")
    simgpu.wait_for_contexts(["exec"], timeout=30)
    time.sleep(1)
    seen = t.container(cid)
    out, err = e.communicate(timeout=60)
    assert e.returncode == 0, err
    assert out.splitlines()[0] == "0", "the exec'd job had no TGS_DIR: docker gives it the image's environment"
    assert seen["processes"] == 1 and seen["launches"] > 0, f"tgsd's view of the container during the exec: {seen}"
    assert seen["memory"]["footprint"] >= 32 << 20, f"its memory is the container's: {seen['memory']}"
    deadline = time.monotonic() + 10
    while t.container(cid)["processes"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert t.container(cid)["processes"] == 0 and t.container(cid)["phase"] == "attached"
    d.docker("rm", "-f", cid, check=False)


def test_tgs_containers_of_a_non_root_user_share(docker, simgpu):
    """Images commonly run as a user (`USER 1000`, `docker run --user`): the shims of such a
    production and opportunistic container reach tgsd and their GPU's activity file, and
    production keeps its engine."""
    d, t = docker()
    hog = Workload(kernel_us=1000, kernels=10, seconds=6, report_s=0.5)
    half = Workload.with_duty(0.5, period_ms=20, kernels=10, seconds=6, report_s=0.5)
    user = ("--user", "1000:1000", "-e", "TGS_LOG_LEVEL=warn")
    p = d.popen(*run_args(*user, "-e", "TGS_CLASS=production", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e",
                          "SIMGPU_LABEL=prod", IMAGE), "sh", "-c", f"id -u; {' '.join(workload(half))}")
    o = d.popen(*run_args(*user, "-e", "TGS_CLASS=opportunistic", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e",
                          "SIMGPU_LABEL=opp", IMAGE), "sh", "-c", f"id -u; {' '.join(workload(hog))}")
    simgpu.wait_for_contexts(["prod", "opp"], timeout=30)
    time.sleep(2)
    seen = {c["class"]: c for c in t.status()["gpus"][0]["containers"]}
    shared = sim.busy_between(*simgpu.snapshots(2))
    (pout, perr), (oout, oerr) = p.communicate(timeout=60), o.communicate(timeout=60)
    assert p.returncode == 0 and o.returncode == 0, perr + oerr
    assert pout.split()[0] == oout.split()[0] == "1000"
    assert "tgs[" not in perr + oerr, f"the shims complained: {perr + oerr}"
    assert seen["production"]["processes"] == 1 and seen["production"]["iteration_starts"] > 0, seen
    assert seen["opportunistic"]["processes"] == 1 and seen["opportunistic"]["gated_s"] > 0, \
        f"the opportunistic shim waited behind production's activity: {seen['opportunistic']}"
    assert shared["prod"] / 2 >= 0.4, f"production got {shared['prod'] / 2:.2f} of the engine (0.5 alone)"


def test_docker_pause_of_production_leaves_the_gpu_to_opportunistic_work(docker, simgpu):
    """`docker pause` freezes a production container, mid-iteration or not: opportunistic
    work takes the GPU while it is paused (tgsd lifts the gate a frozen job holds), and
    production has it back after `docker unpause`."""
    d, t = docker()
    half = Workload.with_duty(0.5, period_ms=20, kernels=10, seconds=14, report_s=0.5)
    hog = Workload(kernel_us=1000, kernels=10, seconds=14, report_s=0.5)
    ask = lambda cls, label: ("-e", f"TGS_CLASS={cls}", "-e", "NVIDIA_VISIBLE_DEVICES=0", "-e", f"SIMGPU_LABEL={label}")
    prod = d.docker("run", "-d", "--network", "none", "--runtime=tgs", *ask("production", "prod"), IMAGE,
                    *workload(half)).stdout.strip()
    o = d.popen(*run_args(*ask("opportunistic", "opp"), IMAGE), *workload(hog))
    simgpu.wait_for_contexts(["prod", "opp"], timeout=30)
    time.sleep(2)
    running = sim.busy_between(*simgpu.snapshots(2))
    for _ in range(10):
        d.docker("pause", prod)
        if simgpu.answers():
            break
        d.docker("unpause", prod)  # frozen mid-launch, holding simgpu's device lock (a simulator's artifact)
        time.sleep(0.1)
    assert simgpu.answers(), "production was frozen mid-launch ten times"
    # frozen between iterations, production is idle; frozen in one, it holds the gate until
    # its work has drained and the GPU has been idle for a second (stall.py): about 2 s
    deadline = time.monotonic() + 10
    while sim.busy_between(*simgpu.snapshots(0.5))["opp"] < 0.4 and time.monotonic() < deadline:
        pass
    paused = sim.busy_between(*simgpu.snapshots(2))
    d.docker("unpause", prod)
    time.sleep(1.5)
    again = sim.busy_between(*simgpu.snapshots(2))
    out, err = o.communicate(timeout=60)
    assert o.returncode == 0, err
    assert d.docker("wait", prod).stdout.strip() == "0"
    assert paused["prod"] == 0 and paused["opp"] / 2 >= 0.8, f"while production was paused: {paused}"
    assert again["prod"] >= 0.9 * running["prod"], f"production: {running['prod']:.2f} s/s before, {again['prod']:.2f} after"
    d.docker("rm", "-f", prod, check=False)


def test_a_stopped_tgs_container_started_again_is_a_tgs_container_again(docker):
    """`docker stop` then `docker start` (or `docker restart`, or a restart policy) makes the
    container again under the same id: it is deregistered when it stops and registered
    again, once, when it starts, with the shim in its processes."""
    d, t = docker()
    cid = d.docker("run", "-d", "--network", "none", "--runtime=tgs", "-e", "TGS_CLASS=opportunistic", "-e",
                   "NVIDIA_VISIBLE_DEVICES=0", IMAGE, "sleep", "60").stdout.strip()
    d.docker("stop", "-t", "0", cid)
    deadline = time.monotonic() + 10
    while t.status()["gpus"][0]["containers"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert t.status()["gpus"][0]["containers"] == [], "a stopped container is deregistered"
    d.docker("start", cid)
    d.docker("restart", "-t", "0", cid)
    assert [(c["id"], c["phase"]) for c in t.status()["gpus"][0]["containers"]] == [(cid, "attached")]
    assert "/usr/lib/tgs/libtgs.so" in d.docker("exec", cid, "maps").stdout
    d.docker("rm", "-f", cid, check=False)


def test_with_tgsd_stopped_create_fails_clearly(docker):
    d, t = docker(run_tgsd=False)
    out = d.docker(*run_args("-e", "TGS_CLASS=production", "-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE), "true",
                   check=False)
    assert out.returncode != 0
    assert "tgs-runtime: cannot set up TGS for this production container: tgsd is not running" in out.stderr
    assert "systemctl start tgsd" in out.stderr
    plain = d.docker(*run_args(IMAGE), "true", check=False)
    assert plain.returncode == 0, "containers that do not ask for TGS still run"


@pytest.mark.parametrize("args,message", [
    (("-e", "TGS_CLASS=batch", "-e", "NVIDIA_VISIBLE_DEVICES=0"), "TGS_CLASS='batch': expected production or opportunistic"),
    (("-e", "TGS_CLASS=production"), "this production container needs a GPU: set NVIDIA_VISIBLE_DEVICES"),
    (("-e", "TGS_CLASS=opportunistic", "-e", "NVIDIA_VISIBLE_DEVICES=9"), "GPU 9: this host has 1 GPU(s)"),
])
def test_bad_requests_fail_clearly_and_leave_nothing(docker, args, message):
    d, t = docker()
    out = d.docker(*run_args(*args, IMAGE), "true", check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert t.status()["gpus"][0]["containers"] == []
    assert list((t.state_dir / "c").iterdir()) == []


def test_production_can_be_restricted_to_the_annotation(docker):
    d, t = docker('[runtime]\nproduction = "annotation"\n')
    out = d.docker(*run_args("-e", "TGS_CLASS=production", "-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE), "true",
                   check=False)
    assert out.returncode != 0 and "production needs the annotation tgs.class=production" in out.stderr
    ok = d.docker(*run_args("-e", "TGS_CLASS=opportunistic", "-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE), "true",
                  check=False)
    assert ok.returncode == 0, ok.stderr


def test_an_images_own_preload_still_works(docker):
    d, t = docker()
    out = d.docker(*run_args("-e", "TGS_CLASS=opportunistic", "-e", "NVIDIA_VISIBLE_DEVICES=0", PRELOAD_IMAGE),
                   "maps")
    assert "image preload ok" in out.stderr
    assert "/usr/lib/tgs/libtgs.so" in out.stdout and "/usr/lib/libimagehello.so" in out.stdout
    plain = d.docker(*run_args(PRELOAD_IMAGE, runtime="runc"), "maps")
    assert "image preload ok" in plain.stderr and "libtgs" not in plain.stdout


def test_static_binaries_run_untouched_in_a_tgs_container(docker):
    d, t = docker()
    out = d.docker(*run_args("-e", "TGS_CLASS=opportunistic", "-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE), "sh", "-c",
                   "cat /etc/ld.so.preload; ls /run/tgs; echo ok")
    assert out.stdout.split() == ["/usr/lib/tgs/libtgs.so", "activity", "control", "ld.so.preload",
                                  "registration.json", "tgs.sock", "ok"]


def test_a_private_dockerd_ends_with_what_started_it(libshim, tmp_path):
    """The private dockerd of the tests and of `tgs bench start`, its containerd and its
    containers end when the process that started it is killed outright (a killed pytest or
    benchmark left them all running)."""
    import subprocess
    import sys

    import psutil

    from tgs_runtime.paths import REPO_ROOT
    from tgs_runtime.privatedocker import end_processes_under

    work = tmp_path / "d"
    starter = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
from tgs_runtime.privatedocker import PrivateDocker
d = PrivateDocker(Path({str(work)!r}), Path({str(libshim.root / "tgs-runtime")!r}), Path({str(tmp_path / "tgs.toml")!r}))
d.start()
d.build_image({{}}, "tgs-test:bare")
cid = d.docker("run", "-d", "--network", "none", "--stop-timeout", "1", "tgs-test:bare", "sleep", "600").stdout.strip()
print(d.proc.pid, d.docker("inspect", "-f", "{{{{.State.Pid}}}}", cid).stdout.strip(), flush=True)
time.sleep(600)
"""], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = starter.stdout.readline()
        assert line, "the starter failed to start its dockerd and container"
        started = [psutil.Process(int(pid)) for pid in line.split()]
        started += [p for p in psutil.process_iter(["cmdline"])  # containerd, the container's shim
                    if p.pid != starter.pid and str(work) in " ".join(p.info["cmdline"] or [])]
        starter.kill()
        _, alive = psutil.wait_procs(started, timeout=40)
        assert not alive, f"left running: {[p.cmdline() for p in alive]}"
    finally:
        starter.kill()
        starter.wait()
        starter.stdout.close()
        end_processes_under(work)  # what a failure left
