# The Attune service image: web (gunicorn with uvicorn workers, whitenoise), Celery worker and beat share it.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.txt requirements-ldap.txt ./
# python-ldap (LDAP sign-in, docs/auth.md) has no wheel: it builds against OpenLDAP's and SASL's headers.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libldap-dev libsasl2-dev \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir -r requirements.txt -r requirements-ldap.txt
COPY . .
RUN DATABASE_URL=sqlite:////tmp/build.sqlite3 python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["gunicorn", "-c", "config/gunicorn.conf.py"]
