"""Host layer: sysfs scan (read) and NVIDIA driver operations (write) for both layouts."""
