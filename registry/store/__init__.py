"""The project's object store: the Django-free blob store bound to OBJECT_STORE_URL
(objectstore), and which team owns each key (keys)."""
