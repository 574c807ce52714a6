"""config.asgi's application with a2wsgi in place of config/wsgi_bridge.py: bench.web_bridge's baseline,
served by gunicorn as `bench.a2wsgi_asgi:application` with the image's settings otherwise."""

from a2wsgi import WSGIMiddleware

from config import asgi

# asgi.application looks its Django application up by this name on every request.
asgi.django_app = WSGIMiddleware(asgi.django_wsgi, workers=asgi.settings.ATTUNE_WEB_THREADS)
application = asgi.application
