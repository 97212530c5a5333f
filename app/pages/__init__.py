"""The pages for people (docs/pages.md): their views, and the pure parts they are drawn from."""
