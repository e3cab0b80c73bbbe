#!/bin/sh
# netreduce vmlab: run by the image's /sbin/netreduce-init (PID 1) from the 9p share.
# Network + soft-RoCE bring-up, then the job; /sbin/netreduce-init powers off afterwards.
R=$(sed -n 's/.*netreduce\.rank=\([0-9]*\).*/\1/p' /proc/cmdline)
OUT=/share/out
mkdir -p $OUT
exec > $OUT/rank$R.init.log 2>&1
. /share/guest/rank$R.env
echo "rank $R: kernel $(uname -r), up $(cut -d' ' -f1 /proc/uptime) s"
modprobe -a virtio_net 2>/dev/null
i=0; while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
ip link set lo up
ip link set eth0 mtu $MTU up
ip addr add $IP/24 dev eth0
modprobe -a rdma_rxe ib_uverbs rdma_ucm || echo "modprobe failed"
rdma link add rxe0 type rxe netdev eth0 || echo "rdma link add failed"
i=0
while [ $i -lt 1200 ]; do
    case "$(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null)" in *ACTIVE*) break;; esac
    sleep 0.1; i=$((i + 1))
done
echo "rxe0: $(cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null) at $(cut -d' ' -f1 /proc/uptime) s"
cut -d' ' -f1 /proc/uptime > $OUT/rank$R.active
PYTHONPATH=/share/py PYTHONDONTWRITEBYTECODE=1 python3 /share/guest/job.py $R
echo "job exit $? at $(cut -d' ' -f1 /proc/uptime) s"
