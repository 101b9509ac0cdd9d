"""Evidence sources: settings, caches, the kubelet's files, CDI specs, the NVIDIA driver. Import
only the core."""
