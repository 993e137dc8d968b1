"""Module-level functions run on spawned ranks (they must be importable by name)."""

import os
import time

import torch
import torch.distributed as dist

import vlmcp


def report_rank(group):
    t = torch.tensor([dist.get_rank(group)])
    dist.all_reduce(t, group=group)
    return dist.get_rank(group), dist.get_world_size(group), int(t)


def raise_on_rank_one(group):
    if dist.get_rank(group) == 1:
        raise ValueError("boom on purpose")
    dist.barrier(group=group)  # rank 0 waits here until killed


def hang_forever(group):
    time.sleep(600)


def die_on_rank_zero(group):
    if dist.get_rank(group) == 0:
        os._exit(3)
    dist.barrier(group=group)


def unshard_round_trip(group, cases):
    """shard -> unshard is the identity, for every case, inside one spawned group."""
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    checked = 0
    for samples, strategy in cases:
        is_image = torch.cat([torch.cat([torch.ones(i, dtype=torch.bool), torch.zeros(t, dtype=torch.bool)])
                              for i, t in samples])
        cu = torch.tensor([0] + [i + t for i, t in samples]).cumsum(0)
        L = is_image.numel()
        plan = vlmcp.plan_cp(is_image, P, cu, image_strategy=strategy)
        shard = plan.for_rank(rank)
        g = torch.Generator().manual_seed(len(samples) * 1000 + L)
        for x, dim in ((torch.randn(L, 5, generator=g, dtype=torch.float64), 0),
                       (torch.randint(0, 100, (3, L), generator=g), 1)):
            back = vlmcp.unshard(shard.shard(x, dim=dim), shard, group, dim=dim)
            assert torch.equal(back, x), (samples, strategy, dim)
            checked += 1
    return checked


def _listening_tcp(pid) -> list[str]:
    """The local addresses (``ip:port``) of the TCP sockets process ``pid`` listens on: the rows of
    ``/proc/net/tcp{,6}`` in state LISTEN (``0A``) whose socket inode is one of the process's fds."""
    import ipaddress

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in open(table).read().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:
                continue
            host, port = fields[1].split(":")
            raw = bytes.fromhex(host)  # 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = ipaddress.ip_address(raw)
            found.append(f"{addr}:{int(port, 16)}")
    return found


def _is_loopback(address: str) -> bool:
    import ipaddress

    addr = ipaddress.ip_address(address.rsplit(":", 1)[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


def listening_sockets(group, launcher):
    """Every listening TCP socket of this rank, of its fork server and of the launcher, after the world
    group, a ``new_group`` subgroup and a collective on each have run; and whether each address is
    loopback."""
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    sub = dist.new_group([0, 1])
    if dist.get_rank(group) in (0, 1):
        dist.all_reduce(t, group=sub)
    dist.barrier(group=group)
    mine = _listening_tcp(os.getpid())
    others = {"fork server": _listening_tcp(os.getppid()), "launcher": _listening_tcp(launcher)}
    dist.barrier(group=group)  # every rank's sockets are still open while the others look
    return {"rank": mine, "loopback": [_is_loopback(a) for a in mine], **others,
            "ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "sum": float(t)}


def kill_rank_two(group):
    """Rank 2 dies by SIGKILL while the others wait for it in an all-reduce."""
    import signal

    dist.barrier(group=group)  # every rank is past init_process_group
    if dist.get_rank(group) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1), group=group)
