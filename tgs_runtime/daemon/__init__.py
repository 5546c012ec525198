"""tgsd: the host daemon that arbitrates GPU time and unified memory between containers."""
