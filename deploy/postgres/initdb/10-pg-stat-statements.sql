-- docker-compose.yml's PostgreSQL loads pg_stat_statements (shared_preload_libraries); this creates
-- its view in the project's database on the first start, as `make stack-up` does for the embedded stack.
CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
