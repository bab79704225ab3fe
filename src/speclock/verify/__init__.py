"""verify: what proves an image or an environment works: doctor, smoke, report, gate, soak, selfcheck."""
