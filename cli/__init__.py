"""attune: the users' command line (submit, queue, show, cancel, log), a standalone REST client."""
