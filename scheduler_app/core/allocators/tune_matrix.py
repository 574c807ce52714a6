"""tune_matrix: Synergy-TUNE that also uses the points of the sensitivity matrix between its two extremes.

Beyond the reference (which only knows best case and proportional): when a job's best case does not
fit, try the intermediate matrix points (throughput.intermediate_points: Pareto-efficient grid
points faster than proportional and slower than the best case, fastest first) before falling back
to proportional (reason `intermediate`). When surplus must be taken back from peers (tune's step
5), a peer is stepped down to the fastest lower point that frees enough on that server, and only
reverted whole to proportional when no intermediate point does (reason `intermediate` or
`reverted_to_proportional`). Everything else, including admission, job order, server choice, peer
order and the guarantee to place every admitted job at no less than proportional speed, is tune's.
"""

from __future__ import annotations

from scheduler_app.core import reasons
from scheduler_app.core.allocators.base import register_allocator
from scheduler_app.core.allocators.tune import TuneAllocator, TuneRound
from scheduler_app.core.placement import EPS, HeldJob, HeldShare
from scheduler_app.core.throughput import OperatingPoint, intermediate_points
from scheduler_app.core.types import JobView


class TuneMatrixRound(TuneRound):
    """Tune's round with intermediate operating points for the job and for the peers it shrinks."""

    def try_intermediate(self, pos: int, job: JobView, best: OperatingPoint) -> bool:
        assert self.shape is not None
        state = self.state
        for point in intermediate_points(job.profile, job.num_gpus, self.shape):
            dc, dm = state.uniform(point.cpus_per_gpu), state.uniform(point.mem_gb_per_gpu)
            if self.try_place(pos, dc, dm, point, point.speed, reasons.INTERMEDIATE):
                return True
        return False

    def home_points(self, job: JobView, best: OperatingPoint) -> list[OperatingPoint]:
        """The best case, then the intermediate points, fastest first."""
        assert self.shape is not None
        return [best, *intermediate_points(job.profile, job.num_gpus, self.shape)]

    def shrink_peer(
        self, peer: HeldJob, share: HeldShare, need_cpus: float, need_mem_gb: float
    ) -> tuple[float, float]:
        """Step the peer down to the fastest lower point covering the need here, else to proportional."""
        current = peer.point
        assert current is not None and self.shape is not None
        k = share.num_gpus
        for point in intermediate_points(peer.job.profile, peer.job.num_gpus, self.shape):
            if point.speed >= current.speed - EPS:
                continue
            # Only points below the current one in both dimensions: stepping down must only free.
            if (
                point.cpus_per_gpu > current.cpus_per_gpu + EPS
                or point.mem_gb_per_gpu > current.mem_gb_per_gpu + EPS
            ):
                continue
            freed_cpus = k * (current.cpus_per_gpu - point.cpus_per_gpu)
            freed_mem_gb = k * (current.mem_gb_per_gpu - point.mem_gb_per_gpu)
            if freed_cpus + EPS >= need_cpus and freed_mem_gb + EPS >= need_mem_gb:
                for s in peer.shares:
                    self.state.adjust(s, s.num_gpus * point.cpus_per_gpu, s.num_gpus * point.mem_gb_per_gpu)
                peer.point, peer.speed, peer.reason = point, point.speed, reasons.INTERMEDIATE
                return freed_cpus, freed_mem_gb
        return self.revert_to_proportional(peer, share)


@register_allocator("tune_matrix")
class TuneMatrixAllocator(TuneAllocator):
    """Tune plus intermediate matrix points for the job and stepwise shrinking of peers."""

    round_class = TuneMatrixRound
