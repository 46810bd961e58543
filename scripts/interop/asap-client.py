#!/usr/bin/env python3
"""asap-client.py -- a minimal ASAP client over kernel SCTP for the security suite
(scripts/interop/30-security.sh): it plays the attacker on the same network (deregistering or
reporting a PE it does not own, flooding associations and handle resolutions) and a
legitimate pool user that measures the resolutions it still gets.

Messages are built from RFC 5352/5354 (type, flags, length; TLV parameters padded to 4 bytes)
and sent with PPID 11 on stream 0 of one-to-one SCTP sockets.

  asap-client.py [--tcp] [--from ADDR] COMMAND ...

  asap-client.py [--from ADDR] dereg        REGISTRAR POOL PE_ID
  asap-client.py [--from ADDR] unreachable  REGISTRAR POOL PE_ID ASSOCIATIONS REPORTS_EACH
  asap-client.py [--from ADDR] assoc-flood  REGISTRAR COUNT HOLD_SECONDS
  asap-client.py [--from ADDR] resolve      REGISTRAR POOL COUNT
  asap-client.py [--from ADDR] resolve-flood REGISTRAR POOL ASSOCIATIONS SECONDS
  asap-client.py [--from ADDR] register-flood REGISTRAR POOL ASSOCIATIONS PES_EACH HOLD_SECONDS

REGISTRAR is ADDR:PORT, PE_ID hex (0x...) or decimal. Output is one line of key=value pairs.
--tcp speaks rserpool's TCP mapping (docs/tcp-mapping.md: a 12-byte frame header, keep-alive
frames answered) instead of SCTP, for hosts without kernel SCTP (scripts/bench-flood).
"""
import socket
import struct
import sys
import time

SCTP_SNDRCV = 1
PPID_ASAP = 11
REGISTRATION, DEREGISTRATION, REGISTRATION_RESPONSE, DEREGISTRATION_RESPONSE = 0x01, 0x02, 0x03, 0x04
HANDLE_RESOLUTION, HANDLE_RESOLUTION_RESPONSE = 0x05, 0x06
ENDPOINT_KEEP_ALIVE, ENDPOINT_KEEP_ALIVE_ACK, ENDPOINT_UNREACHABLE = 0x07, 0x08, 0x09
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

    def drain(self):
        """The messages that are there, without waiting."""
        out = []
        self.s.setblocking(False)
        try:
            while True:
                m = self.s.recv(65536)
                if not m:
                    break
                out.append(m)
        except (BlockingIOError, OSError):
            pass
        self.s.setblocking(True)
        return out

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


class TcpAssociation(Association):
    """The same over rserpool's TCP mapping: DATA frames with PPID 11, keep-alives answered."""

    def __init__(self, registrar, local):
        host, port = registrar.rsplit(":", 1)
        self.s = socket.create_connection(
            (host, int(port)), timeout=10, source_address=(local, 0) if local else None
        )
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data):
        self.s.sendall(struct.pack("!BBHII", 0xE1, 0, 0, PPID_ASAP, len(data)) + data)

    def _frame(self):
        """A whole frame from the buffer, answering keep-alives; None if incomplete."""
        while len(self.buf) >= 12:
            _, ftype, _, _, length = struct.unpack_from("!BBHII", self.buf)
            if len(self.buf) < 12 + length:
                return None
            payload, self.buf = self.buf[12 : 12 + length], self.buf[12 + length :]
            if ftype == 1:
                try:
                    self.s.sendall(struct.pack("!BBHII", 0xE1, 2, 0, 0, len(payload)) + payload)
                except OSError:
                    pass
                continue
            if ftype == 0:
                return payload
        return None

    def recv(self, timeout=10.0):
        end = time.monotonic() + timeout
        while True:
            f = self._frame()
            if f is not None:
                return f
            left = end - time.monotonic()
            if left <= 0:
                return None
            self.s.settimeout(left)
            try:
                data = self.s.recv(65536)
            except (socket.timeout, OSError):
                return None
            if not data:
                return None
            self.buf += data

    def drain(self):
        """Reads what is there without waiting; the whole messages read."""
        self.s.setblocking(False)
        n = []
        try:
            while True:
                data = self.s.recv(65536)
                if not data:
                    break
                self.buf += data
        except (BlockingIOError, OSError):
            pass
        self.s.setblocking(True)
        while True:
            f = self._frame()
            if f is None:
                return n
            n.append(f)

    def alive(self):
        self.s.settimeout(0.05)
        try:
            data = self.s.recv(65536)
            if not data:
                return False
            self.buf += data
            return True
        except socket.timeout:
            return True
        except OSError:
            return False


def registration(pool_name, pe, address, port):
    ipv4 = param(0x0001, socket.inet_aton(address))
    tcp = param(0x0005, struct.pack("!HH", port, 0) + ipv4)
    policy = param(0x0008, struct.pack("!I", 1))
    element = param(POOL_ELEMENT, struct.pack("!III", pe, 0, 60000) + tcp + policy)
    return message(REGISTRATION, [pool(pool_name), element])


def keep_alive_ack(m):
    """The ENDPOINT_KEEP_ALIVE_ACK for an ENDPOINT_KEEP_ALIVE (server id, then parameters)."""
    raw, i = [], 8
    while i + 4 <= len(m):
        ptype, length = struct.unpack_from("!HH", m, i)
        if length < 4:
            break
        if ptype & 0x3FFF in (POOL_HANDLE, PE_IDENTIFIER):
            raw.append(m[i : i + length] + b"\0" * (-length % 4))
        i += length + (-length % 4)
    return message(ENDPOINT_KEEP_ALIVE_ACK, raw)


def pool(name):
    return param(POOL_HANDLE, name.encode())


def pe_id(text):
    return param(PE_IDENTIFIER, struct.pack("!I", int(text, 0)))


def main(argv):
    global Association
    local = None
    if argv and argv[0] == "--tcp":
        Association, argv = TcpAssociation, argv[1:]
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
            try:
                a.send(req)
            except OSError:
                break
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
    elif cmd == "register-flood":
        assocs = []
        for _ in range(int(rest[1])):
            try:
                assocs.append(Association(registrar, local))
            except OSError:
                pass
        address = local or "127.0.0.1"
        accepted, refused, causes, next_id = 0, 0, {}, 0x70000000
        want = int(rest[2])
        pending = {id(a): 0 for a in assocs}
        done = {id(a): 0 for a in assocs}
        # Up to 16 registrations outstanding per association, until each has PES_EACH answers
        # that are final: accepted, or refused for another reason than the rate (0xa, retried
        # as a flooder would). At most 60 s.
        t0 = time.monotonic()
        while any(done[id(a)] < want for a in assocs) and time.monotonic() - t0 < 60:
            for a in assocs:
                while pending[id(a)] < 16 and done[id(a)] + pending[id(a)] < want:
                    next_id += 1
                    try:
                        a.send(registration(rest[0], next_id, address, 9000))
                    except OSError:
                        done[id(a)] = want
                        break
                    pending[id(a)] += 1
                for m in a.drain():
                    if m[0] == ENDPOINT_KEEP_ALIVE:
                        try:
                            a.send(keep_alive_ack(m))
                        except OSError:
                            pass
                    if m[0] == REGISTRATION_RESPONSE:
                        pending[id(a)] -= 1
                        c = cause_of(m)
                        if c is None:
                            accepted += 1
                            done[id(a)] += 1
                        else:
                            refused += 1
                            causes[c] = causes.get(c, 0) + 1
                            if c != 0xA:
                                done[id(a)] += 1
            time.sleep(0.001)
        took = time.monotonic() - t0
        end = time.monotonic() + float(rest[3])
        print(
            "associations=%d accepted=%d refused=%d causes=%s seconds=%.1f"
            % (len(assocs), accepted, refused,
               ",".join("0x%x:%d" % kv for kv in sorted(causes.items())) or "-", took),
            flush=True,
        )
        # Held, answering keep-alives, as PEs that want to stay would.
        while time.monotonic() < end:
            for a in assocs:
                for m in a.drain():
                    if m[0] == ENDPOINT_KEEP_ALIVE:
                        try:
                            a.send(keep_alive_ack(m))
                        except OSError:
                            pass
            time.sleep(0.1)
    elif cmd == "resolve-flood":
        assocs = [Association(registrar, local) for _ in range(int(rest[1]))]
        req = message(HANDLE_RESOLUTION, [pool(rest[0])])
        end, sent, refused, got = time.monotonic() + float(rest[2]), 0, 0, 0
        while time.monotonic() < end:
            for a in assocs:
                for _ in range(16):
                    try:
                        a.send(req)
                        sent += 1
                    except OSError:
                        break
                for m in a.drain():
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
