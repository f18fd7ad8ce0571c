"""The experiment grid on top of the library: its TOML config (:mod:`.config`), the runner (:mod:`.runner`),
results rows (:mod:`.records`), which cells a folder has finished (:mod:`.finished`), the report (:mod:`.report`) and what publishing the grid costs
(:mod:`.grid_privacy`)."""
