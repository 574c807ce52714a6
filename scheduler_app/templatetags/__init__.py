"""Template filters and tags of the site: glossary terms, readable durations."""
