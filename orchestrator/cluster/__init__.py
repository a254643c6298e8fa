"""The Ray cluster a study runs on, and which trial may deploy on its GPUs."""
