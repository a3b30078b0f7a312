"""The web dashboard every node serves at `/`: committed HTML, CSS and ES modules that read the public API."""
