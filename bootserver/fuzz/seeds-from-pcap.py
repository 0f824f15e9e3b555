#!/usr/bin/env python3
"""Cuts fuzz seeds from packet captures of the bootserver's tests.

    UNBOUNDED_CAPTURE_DIR=/tmp/cap flock /tmp/unbounded-vm.lock cargo test -p unbounded-bootserver --test pxe
    python3 bootserver/fuzz/seeds-from-pcap.py /tmp/cap/*.pcap

Writes each distinct DHCP request (UDP to port 67 or 4011), TFTP request (UDP to port 69)
and HTTP request head (TCP to port 8080) into bootserver/fuzz/seeds/{dhcp,tftp,http}/, named
by the SHA-1 of its content. DHCP seeds get the target's leading control byte (0: full
mode, port 67; 2: full mode, port 4011). Standard library only; reads pcap files of link
types Ethernet, Linux cooked (SLL) and SLL2 (what `tcpdump -i any` writes).
"""
import hashlib
import os
import struct
import sys

SEEDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")


def packets(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    endian = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    linktype = struct.unpack(endian + "I", data[20:24])[0]
    offset = 24
    while offset + 16 <= len(data):
        _, _, caplen, _ = struct.unpack(endian + "IIII", data[offset:offset + 16])
        frame = data[offset + 16:offset + 16 + caplen]
        offset += 16 + caplen
        if linktype == 1:  # Ethernet
            if frame[12:14] != b"\x08\x00":
                continue
            yield frame[14:]
        elif linktype == 113:  # Linux SLL
            if frame[14:16] != b"\x08\x00":
                continue
            yield frame[16:]
        elif linktype == 276:  # Linux SLL2
            if frame[0:2] != b"\x08\x00":
                continue
            yield frame[20:]


def transport(ip):
    if len(ip) < 20 or ip[0] >> 4 != 4:
        return None
    ihl = (ip[0] & 15) * 4
    total = struct.unpack(">H", ip[2:4])[0]
    proto = ip[9]
    body = ip[ihl:total]
    if proto == 17 and len(body) >= 8:
        sport, dport = struct.unpack(">HH", body[:4])
        return "udp", sport, dport, body[8:]
    if proto == 6 and len(body) >= 20:
        sport, dport = struct.unpack(">HH", body[:4])
        return "tcp", sport, dport, body[(body[12] >> 4) * 4:]
    return None


def save(target, content):
    folder = os.path.join(SEEDS, target)
    os.makedirs(folder, exist_ok=True)
    name = hashlib.sha1(content).hexdigest()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(content)


def main():
    counts = {}
    for path in sys.argv[1:]:
        for ip in packets(path):
            t = transport(ip)
            if t is None:
                continue
            proto, _, dport, payload = t
            if not payload:
                continue
            if proto == "udp" and dport in (67, 4011) and payload[0] == 1:
                save("dhcp", bytes([0 if dport == 67 else 2]) + payload)
                counts["dhcp"] = counts.get("dhcp", 0) + 1
            elif proto == "udp" and dport == 69:
                save("tftp", payload)
                counts["tftp"] = counts.get("tftp", 0) + 1
            elif proto == "tcp" and dport == 8080 and payload[:4] in (b"GET ", b"HEAD"):
                save("http", payload.split(b"\r\n\r\n")[0] + b"\r\n\r\n")
                counts["http"] = counts.get("http", 0) + 1
    for target in ("dhcp", "tftp", "http"):
        folder = os.path.join(SEEDS, target)
        distinct = len(os.listdir(folder)) if os.path.isdir(folder) else 0
        print(f"{target}: {counts.get(target, 0)} packets, {distinct} distinct seeds")


if __name__ == "__main__":
    main()
