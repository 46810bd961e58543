#!/usr/bin/env python3
"""asap-client.py -- a minimal ASAP client over kernel SCTP for the security suite
(scripts/interop/30-security.sh): it plays the attacker on the same network (deregistering or
reporting a PE it does not own, flooding associations and handle resolutions) and a
legitimate pool user that measures the resolutions it still gets.

Messages are built from RFC 5352/5354 (type, flags, length; TLV parameters padded to 4 bytes)
and sent with PPID 11 on stream 0 of one-to-one SCTP sockets.

  asap-client.py [--from ADDR] dereg        REGISTRAR POOL PE_ID
  asap-client.py [--from ADDR] unreachable  REGISTRAR POOL PE_ID ASSOCIATIONS REPORTS_EACH
  asap-client.py [--from ADDR] assoc-flood  REGISTRAR COUNT HOLD_SECONDS
  asap-client.py [--from ADDR] resolve      REGISTRAR POOL COUNT
  asap-client.py [--from ADDR] resolve-flood REGISTRAR POOL ASSOCIATIONS SECONDS

REGISTRAR is ADDR:PORT, PE_ID hex (0x...) or decimal. Output is one line of key=value pairs.
"""
import socket
import struct
import sys
import time

SCTP_SNDRCV = 1
PPID_ASAP = 11
DEREGISTRATION, DEREGISTRATION_RESPONSE = 0x02, 0x04
HANDLE_RESOLUTION, HANDLE_RESOLUTION_RESPONSE = 0x05, 0x06
ENDPOINT_UNREACHABLE = 0x09
POOL_HANDLE, POOL_ELEMENT, OPERATION_ERROR, PE_IDENTIFIER = 0x0009, 0x000A, 0x000C, 0x000E


def param(ptype, value):
    length = 4 + len(value)
    return struct.pack("!HH", ptype, length) + value + b"\0" * (-length % 4)


def message(mtype, params):
    body = b"".join(params)
    return struct.pack("!BBH", mtype, 0, 4 + len(body)) + body


def params_of(msg):
    """(type, value) of each top-level parameter of an ASAP message."""
    out, i = [], 4
    while i + 4 <= len(msg):
        ptype, length = struct.unpack_from("!HH", msg, i)
        if length < 4:
            break
        out.append((ptype & 0x3FFF, msg[i + 4 : i + length]))
        i += length + (-length % 4)
    return out


def cause_of(msg):
    for ptype, value in params_of(msg):
        if ptype == OPERATION_ERROR and len(value) >= 2:
            return struct.unpack_from("!H", value)[0]
    return None


class Association:
    def __init__(self, registrar, local):
        host, port = registrar.rsplit(":", 1)
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP)
        if local:
            self.s.bind((local, 0))
        self.s.settimeout(10)
        self.s.connect((host, int(port)))

    def send(self, data):
        # struct sctp_sndrcvinfo: stream, ssn, flags, (pad), ppid (network order), context,
        # timetolive, tsn, cumtsn, assoc_id.
        info = struct.pack("=HHH2x", 0, 0, 0) + struct.pack("!I", PPID_ASAP)
        info += struct.pack("=IIIIi", 0, 0, 0, 0, 0)
        self.s.sendmsg([data], [(socket.IPPROTO_SCTP, SCTP_SNDRCV, info)])

    def recv(self, timeout=10.0):
        self.s.settimeout(timeout)
        try:
            data = self.s.recv(65536)
        except (socket.timeout, ConnectionError, OSError):
            return None
        return data or None

    def answer(self, want, timeout=10.0):
        """The next message of type `want` (keep-alives and others skipped)."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return None
            m = self.recv(left)
            if m is None:
                return None
            if m[0] == want:
                return m

    def alive(self):
        """Whether the registrar kept the association (it aborts refused ones)."""
        self.s.settimeout(0.05)
        try:
            data = self.s.recv(65536)
            return bool(data)
        except socket.timeout:
            return True
        except OSError:
            return False


def pool(name):
    return param(POOL_HANDLE, name.encode())


def pe_id(text):
    return param(PE_IDENTIFIER, struct.pack("!I", int(text, 0)))


def main(argv):
    local = None
    if argv and argv[0] == "--from":
        local, argv = argv[1], argv[2:]
    cmd, registrar, rest = argv[0], argv[1], argv[2:]
    if cmd == "dereg":
        a = Association(registrar, local)
        a.send(message(DEREGISTRATION, [pool(rest[0]), pe_id(rest[1])]))
        m = a.answer(DEREGISTRATION_RESPONSE)
        if m is None:
            print("answer=none")
            return 1
        c = cause_of(m)
        print("answer=deregistration_response cause=%s" % ("none" if c is None else "0x%x" % c))
    elif cmd == "unreachable":
        assocs = [Association(registrar, local) for _ in range(int(rest[2]))]
        report = message(ENDPOINT_UNREACHABLE, [pool(rest[0]), pe_id(rest[1])])
        for _ in range(int(rest[3])):
            for a in assocs:
                a.send(report)
        time.sleep(0.5)
        print("sent=%d associations=%d" % (int(rest[2]) * int(rest[3]), len(assocs)))
    elif cmd == "assoc-flood":
        assocs, refused = [], 0
        for _ in range(int(rest[0])):
            try:
                assocs.append(Association(registrar, local))
            except OSError:
                refused += 1
        time.sleep(float(rest[1]))
        up = sum(1 for a in assocs if a.alive())
        print("opened=%d up=%d closed_by_registrar=%d" % (len(assocs), up, len(assocs) - up + refused))
    elif cmd == "resolve":
        a = Association(registrar, local)
        req = message(HANDLE_RESOLUTION, [pool(rest[0])])
        lat, answered, with_pe = [], 0, 0
        t_all = time.monotonic()
        for _ in range(int(rest[1])):
            t = time.monotonic()
            a.send(req)
            m = a.answer(HANDLE_RESOLUTION_RESPONSE)
            if m is None:
                continue
            lat.append(time.monotonic() - t)
            answered += 1
            if any(p == POOL_ELEMENT for p, _ in params_of(m)):
                with_pe += 1
        took = time.monotonic() - t_all
        lat.sort()
        q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] * 1000 if lat else float("nan")
        print(
            "asked=%s answered=%d with_pe=%d rate=%.0f/s p50_ms=%.2f p99_ms=%.2f max_ms=%.2f"
            % (rest[1], answered, with_pe, answered / took if took else 0, q(0.5), q(0.99), q(1.0))
        )
    elif cmd == "resolve-flood":
        assocs = [Association(registrar, local) for _ in range(int(rest[1]))]
        req = message(HANDLE_RESOLUTION, [pool(rest[0])])
        end, sent, refused, got = time.monotonic() + float(rest[2]), 0, 0, 0
        for a in assocs:
            a.s.setblocking(False)
        while time.monotonic() < end:
            for a in assocs:
                for _ in range(16):
                    try:
                        a.send(req)
                        sent += 1
                    except (BlockingIOError, OSError):
                        break
                while True:
                    try:
                        m = a.s.recv(65536)
                    except (BlockingIOError, OSError):
                        break
                    if not m:
                        break
                    got += 1
                    if m[0] == HANDLE_RESOLUTION_RESPONSE and cause_of(m) == 0xA:
                        refused += 1
        print("sent=%d answered=%d refused_0xa=%d" % (sent, got, refused))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
