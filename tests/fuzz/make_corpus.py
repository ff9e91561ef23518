#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets: tests/fuzz/corpus/<target>/<name>.

A handful of small valid inputs per target, built here from the formats' documentation (the
headers named below), plus edge cases and the regression inputs of bugs the fuzzers found.
Deterministic: running it again rewrites the same files. Inputs that the fuzzers found on their
own and that were kept are added by hand (see docs/fuzz.md) and are not touched here.

    python3 tests/fuzz/make_corpus.py
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- MessagePack (a tiny encoder: nil, bool, int, float64, str, bin, array, map) ----
def mp(v):
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        return (bytes([0xA0 | len(b)]) if len(b) < 32 else b"\xd9" + bytes([len(b)])) + b
    if isinstance(v, bytes):
        return b"\xc4" + bytes([len(v)]) + v
    if isinstance(v, list):
        return bytes([0x90 | len(v)]) + b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        return bytes([0x80 | len(v)]) + b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(v)


# ---- store_protocol: store/include/loom/store/store_protocol.h ----
def store_frame(op, id=1, number=0, keys=(), values=(), magic=0x4C4D5354, version=1, flags=0):
    payload = struct.pack(">qI", number, len(keys))
    for k in keys:
        payload += struct.pack(">I", len(k)) + k
    payload += struct.pack(">I", len(values))
    for v in values:
        payload += struct.pack(">I", len(v)) + v
    return struct.pack(">IHBBQQ", magic, version, op, flags, id, len(payload)) + payload


def store_protocol():
    t = "store_protocol"
    put(t, "hello", store_frame(1, number=-1, keys=[b"client-7"], values=[b"secret"]))
    put(t, "set", store_frame(2, id=2, keys=[b"rank/0/addr"], values=[b"10.0.0.1:29500"]))
    put(t, "get", store_frame(3, id=3, keys=[b"rank/0/addr"]))
    put(t, "add", store_frame(4, id=4, number=1, keys=[b"counter"]))
    put(t, "compare_set", store_frame(5, id=5, keys=[b"k"], values=[b"", b"v"]))
    put(t, "multi_set", store_frame(11, id=6, keys=[b"a", b"b"], values=[b"1", b"22"]))
    put(t, "ok_reply", store_frame(64, id=6, values=[b"-42"]))
    put(t, "error_reply", store_frame(65, id=7, keys=[b"key 'x' timed out"], number=0))
    put(t, "two_frames", store_frame(9, id=8) + store_frame(7, id=9, keys=[b"a", b"b"]))
    # Edge cases: a truncated frame, a bad magic, non-zero flags, an absurd length.
    put(t, "truncated", store_frame(2, keys=[b"k"], values=[b"value"])[:30])
    put(t, "bad_magic", store_frame(2, keys=[b"k"], values=[b"v"], magic=0x4C4D5355))
    put(t, "flags", store_frame(9, flags=1))
    put(t, "huge_length", struct.pack(">IHBBQQ", 0x4C4D5354, 1, 2, 0, 1, 1 << 62))


# ---- settings: first byte picks a declared variable (table order), the rest is the value ----
def settings():
    t = "settings"
    values = ["1", "0", "512K", "4MiB", "1gib", "auto", "ring", "-5", "65536",
              "99999999999999999999", "1x", " 1", "on", "YES", "generic", "tcp://h:1"]
    for i, v in enumerate(values):
        put(t, "v%02d" % i, bytes([i * 5 % 256]) + v.encode())


# ---- tuning: comm/include/loom/comm/tuning.h; first byte: the key the reader asks for ----
TUNING = """# loom tuning v1
[world=2 per_host=2 transport=tcp]
allreduce.rd_max = 131072
allreduce.hd_max = 33554432
broadcast.tree_max = 65536
gather.direct_max = 65536
"""


def tuning():
    t = "tuning"
    put(t, "basic", b"\x00" + TUNING.encode())
    put(t, "rules", b"\x00" + (TUNING + "broadcast.rules = 0:tree 131072:chain 1048576:tree\n"
                               "allreduce.rules = 0:rd 65536:ring\n").encode())
    shm = TUNING.replace("world=2 per_host=2 transport=tcp", "world=4 per_host=1 transport=shm+tcp")
    put(t, "cma", b"\x01" + (shm + "allgather.cma_min = 65536\nallgather.cma_max = 67108864\n"
                             "reduce_scatter.cma_min = 0\nreduce_scatter.cma_max = 0\n").encode())
    put(t, "other_section", b"\x02" + TUNING.replace("world=2", "world=8").encode())
    put(t, "two_sections", b"\x00" + (TUNING + TUNING.replace("world=2", "world=3")
                                      .replace("# loom tuning v1\n", "")).encode())
    # Edge cases: another version, a bad number, a rule list that does not rise, min > max.
    put(t, "version", b"\x00" + TUNING.replace("v1", "v2").encode())
    put(t, "bad_number", b"\x00" + TUNING.replace("65536\n", "64K\n", 1).encode())
    put(t, "bad_rules", b"\x00" + (TUNING + "allgather.rules = 0:ring 0:direct\n").encode())
    put(t, "min_above_max", b"\x01" + (shm + "broadcast.cma_min = 9\nbroadcast.cma_max = 8\n")
        .encode())


# ---- tuning_cache: comm/include/loom/comm/tuning_cache.h; first byte: even 2 ranks on one
# host, odd 4 ranks 1-3 per host; the fuzzer's Loom is "fuzz", its host "Fuzz CPU" with 8 CPUs ----
def tuning_cache():
    t = "tuning_cache"
    section = {"allreduce.rd_max": 131072, "allreduce.hd_max": 33554432,
               "broadcast.tree_max": 65536, "gather.direct_max": 65536}

    def cache(sections, **changes):
        doc = {"format": "loom-tuning-cache", "version": 1, "loom": "fuzz",
               "host": {"fingerprint": "0000000000000000", "cpu_model": "Fuzz CPU", "cpus": 8,
                        "l2_bytes": 1048576, "l3_bytes": 0},
               "sections": sections}
        doc.update(changes)
        return json.dumps(doc, indent=1, sort_keys=True)

    two = "world=2 per_host=2 transport=tcp"
    uneven = "world=4 per_host=1-3 transport=shm+tcp"
    put(t, "basic", b"\x00" + cache({two: section}).encode())
    put(t, "rules_cma", b"\x01" + cache({uneven: dict(section, **{
        "allreduce.rules": "0:rd 65536:ring", "allgather.cma_min": 65536,
        "allgather.cma_max": 67108864})}).encode())
    put(t, "two_sections", b"\x00" + cache({two: section, uneven: section}).encode())
    # Edge cases: no section, stale, foreign, a wrong type, not JSON.
    put(t, "no_section", b"\x01" + cache({two: section}).encode())
    put(t, "stale", b"\x00" + cache({two: section}, version=0).encode())
    put(t, "foreign", b"\x00" + cache({two: section}, host={"cpu_model": 7, "cpus": "8"}).encode())
    put(t, "bad_value", b"\x00" + cache({two: dict(section, **{"allreduce.rd_max": 1.5})}).encode())
    put(t, "not_json", b"\x00" + b"{\"format\": \"loom-tuning-cache\", \"sections\": {")


# ---- rpc_wire: rpc/src/wire.h (40-byte little-endian header, name, MessagePack payload) ----
def rpc_frame(kind, name=b"", payload=b"", id=1, aux=0, timeout=0, magic=0x4350524C, version=1):
    return struct.pack("<IBBHIIQQQ", magic, version, kind, 0, timeout, len(name), id, aux,
                       len(payload)) + name + payload


def rpc_wire():
    t = "rpc_wire"
    put(t, "hello", rpc_frame(1, b"trainer0", id=0))
    put(t, "request", rpc_frame(2, b"add", mp([1, 2]), id=5, timeout=60000))
    put(t, "remote", rpc_frame(3, b"make", mp([{"dims": [2, 3], "scale": 0.5}]), id=6, aux=77))
    put(t, "fetch_delete", rpc_frame(4, id=7, aux=77) + rpc_frame(5, aux=77))
    put(t, "result_blob", rpc_frame(6, payload=mp(struct.pack("<4f", 1, 2, 3, 4)), id=5))
    put(t, "result_values", rpc_frame(6, payload=mp([None, True, False, -7, 3.25, "s", {}]), id=6))
    put(t, "error", rpc_frame(7, payload=mp({"type": "loom::InvalidArgumentError",
                                              "message": "no function 'x'"}), id=8))
    put(t, "error_malformed", rpc_frame(7, payload=b"\x92\x01", id=9))
    # Edge cases: a bad magic, an unknown kind, a truncated frame, an oversized name.
    put(t, "bad_magic", rpc_frame(2, b"f", magic=0x4350524D))
    put(t, "unknown_kind", rpc_frame(9, b"f"))
    put(t, "truncated", rpc_frame(2, b"function", mp([1]))[:45])
    put(t, "long_name", struct.pack("<IBBHIIQQQ", 0x4350524C, 1, 2, 0, 0, 5000, 1, 0, 0))
    # Regression: nested one-element arrays (one byte a level) overflowed the stack of the
    # thread decoding them (nlohmann's reader recurses per level); decode() now refuses more
    # than 512 levels.
    put(t, "regress_deep_nesting", rpc_frame(2, b"f", b"\x91" * 100000 + b"\xc0"))


# ---- npy: autograd_lite/include/loom/autograd/npy.h (NumPy format 1.0 / 2.0 / 3.0) ----
def npy(descr, shape, data, version=1, fortran="False", header=None):
    if header is None:
        dims = "".join("%d, " % d for d in shape)
        if len(shape) == 1:
            dims = dims[:-1]
        elif shape:
            dims = dims[:-2]
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (descr, fortran, dims)
    lenbytes = 2 if version == 1 else 4
    total = 6 + 2 + lenbytes + len(header) + 1
    header += " " * ((64 - total % 64) % 64) + "\n"
    fmt = "<H" if version == 1 else "<I"
    return b"\x93NUMPY" + bytes([version, 0]) + struct.pack(fmt, len(header)) + header.encode() + data


def npy_corpus():
    t = "npy"
    put(t, "f4_2x3", npy("<f4", (2, 3), struct.pack("<6f", *range(6))))
    put(t, "f8_vector", npy("<f8", (3,), struct.pack("<3d", 0.5, -1, 1e300)))
    put(t, "i8_scalar", npy("<i8", (), struct.pack("<q", -9)))
    put(t, "f2_empty", npy("<f2", (0, 4), b""))
    put(t, "v2_f4", npy("<f4", (2,), struct.pack("<2f", 1, 2), version=2))
    put(t, "v3_i8", npy("<i8", (1, 1, 1), struct.pack("<q", 5), version=3))
    # Edge cases: Fortran order, big-endian, an unsupported dtype, truncated data.
    put(t, "fortran", npy("<f4", (2, 2), struct.pack("<4f", 1, 2, 3, 4), fortran="True"))
    put(t, "big_endian", npy(">f4", (1,), struct.pack(">f", 1)))
    put(t, "u1", npy("|u1", (3,), b"abc"))
    put(t, "truncated", npy("<f8", (4,), struct.pack("<2d", 1, 2)))
    # Regressions: a shape far larger than the file (allocated before the data were read), a
    # shape whose element count overflows int64, and a version 2.0 header length of 4 GiB
    # (allocated before it was read).
    put(t, "regress_huge_shape", npy("<f4", (1 << 40, 1 << 20), b""))
    put(t, "regress_overflow_shape", npy("<f8", (1 << 62, 1 << 62, 16), b""))
    put(t, "regress_huge_header", b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{")


# ---- safetensors: autograd_lite/include/loom/autograd/serialize.h ----
def safetensors(entries, data, metadata=None, raw_header=None):
    if raw_header is None:
        h = {}
        for name, dtype, shape, begin, end in entries:
            h[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}
        if metadata is not None:
            h["__metadata__"] = metadata
        raw_header = json.dumps(h, separators=(",", ":"))
    raw_header += " " * ((8 - len(raw_header) % 8) % 8)
    return struct.pack("<Q", len(raw_header)) + raw_header.encode() + data


def safetensors_corpus():
    t = "safetensors"
    w = struct.pack("<6f", *range(6))
    b = struct.pack("<2f", 0.5, -0.5)
    put(t, "two_tensors", safetensors([("0.weight", "F32", (2, 3), 0, 24),
                                        ("0.bias", "F32", (2,), 24, 32)], w + b,
                                       metadata={"format": "pt"}))
    put(t, "dtypes", safetensors([("a", "F64", (1,), 0, 8), ("b", "I64", (), 8, 16),
                                   ("c", "BF16", (2,), 16, 20), ("d", "F16", (2,), 20, 24)],
                                  struct.pack("<dq", 1.5, -3) + b"\x80\x3f\x00\x40\x00\x3c\x00\xc0"))
    put(t, "empty", safetensors([], b""))
    put(t, "zero_size", safetensors([("z", "F32", (0, 5), 0, 0)], b""))
    put(t, "shared_bytes", safetensors([("x", "F32", (2,), 0, 8), ("y", "F32", (2,), 0, 8)], b))
    # Edge cases: offsets that do not match the shape, data past the file, a bad dtype, a header
    # longer than the file, a header that is not an object.
    put(t, "bad_offsets", safetensors([("x", "F32", (2,), 0, 4)], b))
    put(t, "past_end", safetensors([("x", "F32", (4,), 0, 16)], b))
    put(t, "bad_dtype", safetensors([("x", "U8", (2,), 0, 2)], b"ab"))
    put(t, "long_header", struct.pack("<Q", 1000) + b"{}")
    put(t, "not_object", safetensors([], b"", raw_header="[1,2]"))
    # Regressions: a shape far larger than the file (allocated before its offsets were
    # checked), and a shape whose element count overflows int64.
    put(t, "regress_huge_shape", safetensors([("x", "F32", (1 << 40, 1 << 20), 0, 8)], b))
    put(t, "regress_overflow_shape",
        safetensors([("x", "F64", (1 << 62, 1 << 62, 16), 0, 0)], b""))


# ---- doctor_dump: docs/diagnostics.md, "Dump format" (process_group/src/diagnostics) ----
def dump(rank=0, size=2, entries=(), **over):
    d = {"format": "loom-flight-record", "version": 1, "rank": rank, "size": size, "group": "",
         "backend": "tcp", "host": "node7", "pid": 4242, "reason": "SIGUSR1",
         "time_us": 1764041234567890, "capacity": 2000, "recorded": len(entries),
         "last_seq": len(entries), "entries": list(entries)}
    d.update(over)
    return json.dumps(d, indent=1)


def entry(id, seq, op="allreduce", state="done", **over):
    e = {"id": id, "seq": seq, "op": op, "dtype": "float", "count": 1024, "bytes": 4096,
         "reduce_op": "sum", "root": 0, "algorithm": "ring", "state": state, "peer": -1,
         "issue_us": 1764041230000000 + id, "start_us": 1764041230000100 + id,
         "end_us": 1764041230000900 + id if state == "done" else 0, "precise": True}
    e.update(over)
    return e


def doctor_dump():
    t = "doctor_dump"
    put(t, "empty", dump())
    put(t, "done_and_running", dump(1, 4, [entry(1, 1), entry(2, 2, "broadcast", root=2),
                                           entry(3, 3, state="running", algorithm="auto")]))
    put(t, "failed", dump(0, 2, [entry(1, 1, "barrier", dtype="uint8", count=0, bytes=0),
                                 entry(2, 2, state="failed", peer=1, precise=False)],
                          reason="failure", group="pg1", backend="verbs"))
    put(t, "send_recv", dump(0, 3, [entry(1, 1, "send", root=2), entry(2, 1, "recv", root=-2),
                                    entry(3, 4, "alltoallv", state="queued")]))
    # Edge cases: another version, a rank outside the group, an unknown op, a number where a
    # string goes, a truncated dump.
    put(t, "version", dump(version=2))
    put(t, "rank_out_of_range", dump(rank=3, size=2))
    put(t, "unknown_op", dump(entries=[entry(1, 1, "allreduce2")]))
    put(t, "wrong_type", dump(entries=[entry(1, 1, count="many")]))
    put(t, "truncated", dump(entries=[entry(1, 1)])[:200])
    put(t, "float_rank", dump().replace('"rank": 0', '"rank": 1e300'))


# ---- rendezvous: tools/loom_run/rendezvous.h, elastic_rendezvous.h ----
# Byte 0: bit 0 elastic, (b >> 1) % 4 + 1 nodes, (b >> 3) % nodes this node; then one value a
# line (static: node/0.., worker_port; elastic: closed, node/0.., worker_port).
def shape(elastic, nnodes, me):
    return bytes([(1 if elastic else 0) | ((nnodes - 1) << 1) | (me << 3)])


def rendezvous():
    t = "rendezvous"
    put(t, "static_1", shape(False, 1, 0) + b"nproc=2;restarts=0;host=a\n29500")
    put(t, "static_3", shape(False, 3, 1) + b"nproc=4;restarts=1;host=a\n"
        b"nproc=4;restarts=1;host=b\nnproc=1;restarts=1;host=c\n29501")
    put(t, "elastic_2", shape(True, 2, 1) + b"2\nnproc=2;host=a;addr=10.0.0.1\n"
        b"nproc=3;host=b;addr=10.0.0.2\n29502")
    put(t, "elastic_late", shape(True, 2, 1) + b"1\nnproc=2;host=a;addr=10.0.0.1")
    # Edge cases: numbers that are not numbers, out of range, or too large.
    # (This node writes its own node key, and node 0 the port: the others' are the input.)
    put(t, "bad_nproc", shape(False, 2, 1) + b"nproc=x;restarts=0;host=a\nnproc=2;restarts=0")
    put(t, "bad_port", shape(False, 2, 1) + b"nproc=2;restarts=0;host=a\n\n99999999999")
    put(t, "bad_closed", shape(True, 2, 0) + b"two")
    put(t, "huge_closed", shape(True, 2, 0) + b"1000000000")
    put(t, "negative_nproc", shape(False, 2, 1) + b"nproc=-3;restarts=0;host=a")


# ---- tcp_frame, tcp_heal: FuzzedDataProvider inputs (no readable structure): fixed
# pseudo-random seeds of a few sizes, and two plain patterns ----
def pseudo_random(target, sizes):
    import random
    rng = random.Random(target)
    for n in sizes:
        put(target, "random_%d" % n, bytes(rng.randrange(256) for _ in range(n)))
    put(target, "zeros", bytes(64))
    put(target, "ones", b"\xff" * 64)


if __name__ == "__main__":
    store_protocol()
    settings()
    tuning()
    tuning_cache()
    rpc_wire()
    npy_corpus()
    safetensors_corpus()
    doctor_dump()
    rendezvous()
    pseudo_random("tcp_frame", [16, 64, 200, 600, 1500])
    pseudo_random("tcp_heal", [16, 64, 200, 600])
