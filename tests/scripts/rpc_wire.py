"""The cluster RPC's wire format by hand, for tests that send frames no client would: a frame is a
4-byte little-endian length and a kvmesh.v1.Frame (proto/kvmesh/v1/kvmesh.proto)."""
import struct


def varint(n):
    out = b""
    while True:
        out += bytes([(n & 0x7f) | (0x80 if n > 0x7f else 0)])
        n >>= 7
        if not n:
            return out


def ld(field, payload):
    """A length-delimited field (a string, bytes or a message)."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def vi(field, n):
    """A varint field."""
    return varint(field << 3) + varint(n)


def frame(rid, field, body):
    """A Frame with request_id `rid` and body field number `field` holding the message `body`."""
    f = vi(1, rid) + ld(field, body)
    return struct.pack("<I", len(f)) + f


def fields(b):
    """The top-level fields of a message: {number: [values]} (varints as ints, the rest bytes)."""
    out, i = {}, 0

    def var():
        nonlocal i
        n = shift = 0
        while True:
            c = b[i]
            i += 1
            n |= (c & 0x7f) << shift
            shift += 7
            if c < 0x80:
                return n

    while i < len(b):
        key = var()
        if key & 7 == 0:
            v = var()
        elif key & 7 == 2:
            n = var()
            v = b[i:i + n]
            i += n
        elif key & 7 == 1:
            v = b[i:i + 8]
            i += 8
        else:
            v = b[i:i + 4]
            i += 4
        out.setdefault(key >> 3, []).append(v)
    return out


def recv_all(s, n):
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, "closed"
        data += chunk
    return data


def reply_bytes(s):
    """The next frame's bytes (without its length)."""
    return recv_all(s, struct.unpack("<I", recv_all(s, 4))[0])


def reply(s):
    """The next frame as (request id, body field number, the body's fields)."""
    f = fields(reply_bytes(s))
    body = [k for k in f if k != 1][0]
    return f.get(1, [0])[0], body, fields(f[body][0])
