"""The top floor: the `prime` CLI (`cli/`) and the Textual app (`app`, `screens/`, `widgets/`, and `dashboards/`,
the textual-free models the run pages fold from events). The only package that imports textual."""
