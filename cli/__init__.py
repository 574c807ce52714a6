"""attune: the users' command line (sbatch, squeue, sinfo, sreport and the rest), a standalone REST client."""

__version__ = "0.1.0"
