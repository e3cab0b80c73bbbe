#!/bin/sh
# netreduce vmlab: run by the image's /sbin/netreduce-init (PID 1) from the 9p share.
# Network + soft-RoCE bring-up, then the job; /sbin/netreduce-init powers off afterwards.
# The job's Python starts while rxe0 comes up (its imports take seconds under TCG; it waits for
# the port to be ACTIVE itself). Every step logs, so a host watchdog can say where a VM stopped.
R=$(sed -n 's/.*netreduce\.rank=\([0-9]*\).*/\1/p' /proc/cmdline)
OUT=/share/out
mkdir -p $OUT
exec > $OUT/rank$R.init.log 2>&1
. /share/guest/rank$R.env
up() { cut -d' ' -f1 /proc/uptime; }
echo "rank $R: kernel $(uname -r), init at $(up) s"
modprobe -a virtio_net 2>/dev/null
i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
[ -e /sys/class/net/eth0 ] || echo "eth0 missing after 60 s"
ip link set lo up
ip link set eth0 mtu $MTU up
ip addr add $IP/24 dev eth0
modprobe -a rdma_rxe ib_uverbs rdma_ucm || echo "modprobe failed"
rdma link add rxe0 type rxe netdev eth0 || echo "rdma link add failed"
echo "rxe0 added at $(up) s; job starting"
(
    i=0
    while [ $i -lt 1200 ]; do
        case "$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null)" in *ACTIVE*) break;; esac
        sleep 0.1; i=$((i + 1))
    done
    echo "rxe0: $(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null) at $(up) s"
    up > $OUT/rank$R.active
) &
PYTHONPATH=/share/py PYTHONDONTWRITEBYTECODE=1 python3 -u /share/guest/job.py $R
echo "job exit $? at $(up) s"
