"""tgs_runtime/proto.py mirrors libshim/include/tgs_proto.h: every struct's size, every
field's offset and size, every constant."""
from __future__ import annotations

import ctypes as C
import json
import subprocess

import pytest

from tgs_runtime import proto
from tgs_runtime.paths import REPO_ROOT


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "tgs_proto.h"', "int main(void) {",
             '  printf("{\\"structs\\": {");']
    for i, s in enumerate(proto.STRUCTS):
        name = s._c_name_
        lines.append(f'  printf("%s\\"{name}\\": {{\\"size\\": %zu, \\"fields\\": {{", "{"," if i else ""}", '
                     f"sizeof(struct {name}));")
        for j, (field, _) in enumerate(s._fields_):
            lines.append(f'  printf("%s\\"{field}\\": [%zu, %zu]", "{"," if j else ""}", offsetof(struct {name}, {field}), '
                         f"sizeof(((struct {name} *)0)->{field}));")
        lines.append('  printf("}}");')
    lines.append('  printf("}, \\"constants\\": {");')
    for i, name in enumerate(proto.CONSTANTS):
        lines.append(f'  printf("%s\\"{name}\\": %llu", "{"," if i else ""}", (unsigned long long)({name}));')
    lines.append('  printf("}, \\"strings\\": {");')
    for i, name in enumerate(proto.STRINGS):
        lines.append(f'  printf("%s\\"{name}\\": \\"%s\\"", "{"," if i else ""}", {name});')
    lines += ['  printf("}}\\n");', "  return 0;", "}"]
    d = tmp_path_factory.mktemp("proto")
    src, exe = d / "layout.c", d / "layout"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run(["cc", "-Wall", "-Werror", f"-I{REPO_ROOT / 'libshim' / 'include'}", str(src), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return json.loads(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)


@pytest.mark.parametrize("struct", proto.STRUCTS, ids=lambda s: s._c_name_)
def test_struct_layouts_agree(c_layout, struct):
    c = c_layout["structs"][struct._c_name_]
    assert C.sizeof(struct) == c["size"]
    for field, ftype in struct._fields_:
        assert [getattr(struct, field).offset, C.sizeof(ftype)] == c["fields"][field], field


def test_structs_have_no_hidden_padding(c_layout):
    for struct in proto.STRUCTS:
        c = c_layout["structs"][struct._c_name_]
        end = max(off + size for off, size in c["fields"].values())
        assert end == c["size"], f"{struct._c_name_} has {c['size'] - end} bytes of tail padding"


def test_constants_agree(c_layout):
    assert c_layout["constants"] == proto.CONSTANTS
    assert c_layout["strings"] == proto.STRINGS


def test_control_block_pages():
    assert proto.Control.daemon.offset == proto.DAEMON_OFFSET
    assert proto.Control.shim.offset == proto.SHIM_OFFSET
    assert C.sizeof(proto.Control) == proto.CONTROL_SIZE
    assert C.sizeof(proto.Activity) <= proto.ACTIVITY_SIZE, "the activity file is one page"


def test_parse_refuses_what_breaks_the_contract():
    hello = proto.message(proto.MsgHello, pid=1)
    assert isinstance(proto.parse(bytes(hello)), proto.MsgHello)
    with pytest.raises(proto.ProtocolError, match="shorter than a header"):
        proto.parse(b"\0" * 8)
    bad = bytearray(bytes(hello))
    bad[0] = 0
    with pytest.raises(proto.ProtocolError, match="bad magic"):
        proto.parse(bytes(bad))
    with pytest.raises(proto.ProtocolError, match="expected"):
        proto.parse(bytes(hello) + b"\0")
    other = proto.message(proto.MsgHello, type_=proto.MsgType.BYE)
    with pytest.raises(proto.ProtocolError):
        proto.parse(bytes(other))
    with pytest.raises(proto.ProtocolError, match="larger than"):
        proto.frame(b"\0" * (proto.MAX_FRAME + 1))


def test_tgsd_reads_a_production_process_s_rhythm_from_the_expectation_it_wrote(tmp_path):
    """Going idle, a production process expects to launch again from its shortest recent
    idle spell on: twice that is the longest spell it takes as its rhythm (where its shim
    starts counting a pause). None while it runs (withdrawn), nor for slots without one."""
    from tgs_runtime.control import ActivityFile

    act = ActivityFile.create(tmp_path / "activity")
    assert act.rhythm_ns(3) == 0, "nothing written"
    act.expect(3, 1_000_000_000, 1_600_000_000, 2_100_000_000)
    assert act.rhythm_ns(3) == 1_200_000_000
    act.view.expect[3].due_until_ns = 0  # it launched again
    assert act.rhythm_ns(3) == 0
    assert act.rhythm_ns(proto.EXPECT_SLOTS) == act.rhythm_ns(proto.NO_SLOT) == 0
    act.close()


def test_tgsd_tells_a_production_process_that_used_the_gpu_from_its_byte_or_its_expectation(tmp_path):
    """A process has used a GPU while its byte there is set, and for good once it has
    written an expectation there; a slot cleared for the next process says neither."""
    from tgs_runtime.control import ActivityFile

    act = ActivityFile.create(tmp_path / "activity")
    assert not act.used(3)
    act.view.busy[3] = 1
    assert act.used(3)
    act.view.busy[3] = 0
    act.expect(3, 100, 200, 300)
    act.view.expect[3].due_until_ns = 0  # it launched again: its expectation withdrawn, its last still there
    assert act.used(3)
    act.clear(3)
    assert not act.used(3), "the slot's next process has not used the GPU"
    act.view.busy[proto.EXPECT_SLOTS] = 1
    assert act.used(proto.EXPECT_SLOTS) and not act.used(proto.NO_SLOT)
    act.close()



def test_tgsd_finds_the_production_processes_busy_on_a_gpu(tmp_path):
    """The slots whose byte is set, any of 256 (tgsd asks every control period while
    production launches nothing: whether it holds the GPU busy anyway)."""
    from tgs_runtime.control import ActivityFile

    act = ActivityFile.create(tmp_path / "activity")
    assert act.busy_slots() == []
    act.view.busy[0] = act.view.busy[3] = 1
    act.view.busy[proto.ACTIVITY_SLOTS - 1] = 7
    assert act.busy_slots() == [0, 3, proto.ACTIVITY_SLOTS - 1]
    act.clear(3)
    assert act.busy_slots() == [0, proto.ACTIVITY_SLOTS - 1]
    act.close()

def test_a_dead_production_process_leaves_neither_its_byte_nor_its_expectation(tmp_path):
    from tgs_runtime.control import ActivityFile

    act = ActivityFile.create(tmp_path / "activity")
    act.view.busy[3] = 1
    act.expect(3, 100, 200, 300)
    assert act.view.expect_slots == 4, "opportunistic shims read expectations up to slot 3"
    act.clear(3, in_use={0, 1})
    assert act.view.busy[3] == 0 and act.view.expect[3].due_until_ns == 0
    assert act.view.expect_slots == 2, "opportunistic shims read no further than the slots in use"
    act.clear(proto.EXPECT_SLOTS + 1)  # slots without an expectation are cleared too
    assert act.view.expect_slots == 0
    act.close()
