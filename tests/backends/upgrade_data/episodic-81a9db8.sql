--
-- PostgreSQL database dump
--

\restrict q5Pwf8D69kx8lakKwGY9ABVf6h21c8ZmszmsgfMIWiNgev6TYk3cz7NaXYENgIG

-- Dumped from database version 18.6
-- Dumped by pg_dump version 18.6

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET transaction_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: vector; Type: EXTENSION; Schema: -; Owner: -
--

CREATE EXTENSION IF NOT EXISTS vector WITH SCHEMA public;


--
-- Name: records_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.records_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: records; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.records (
    id text NOT NULL,
    seq bigint DEFAULT nextval('public.records_seq'::regclass) NOT NULL,
    owner text,
    session text,
    role text,
    "group" text,
    tier text,
    key text,
    revision bigint DEFAULT 1 NOT NULL,
    metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL,
    salience double precision DEFAULT 0.5 NOT NULL,
    access_count bigint DEFAULT 0 NOT NULL,
    accessed_at timestamp with time zone,
    uri text,
    media_type text,
    content text NOT NULL,
    fts tsvector GENERATED ALWAYS AS ((to_tsvector('english'::regconfig, content) || to_tsvector('simple'::regconfig, content))) STORED,
    embedding public.vector(4)
);


--
-- Name: schema_version; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.schema_version (
    version integer NOT NULL,
    description text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Data for Name: records; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.records VALUES ('imported-anon', 3, NULL, 's2', 'user', NULL, NULL, NULL, 1, '{}', '2025-01-02 03:04:05.678+00', 0.8125, 5, '2025-02-03 04:05:06.789+00', NULL, NULL, 'anon: imported note about trains', DEFAULT, NULL);
INSERT INTO public.records VALUES ('ae5cdf7de3d44619bb70b44e8aaa34c8', 9, NULL, 's1', NULL, NULL, NULL, 'app/prefs/drink', 3, '{"rev": 2}', '2026-12-06 13:14:50.289+00', 0.5, 0, NULL, NULL, NULL, 'anon prefers tea, version 2', DEFAULT, '[0,0,1,0]');
INSERT INTO public.records VALUES ('4b192207a75d4ca4bb624b16ebc9e789', 1, NULL, 's1', 'user', NULL, NULL, NULL, 1, '{"f": 0.1, "n": 42, "big": 12345678901234567, "uni": "héllo ✓", "nested": {"l": [1, 2.5, "x", null, true]}}', '2026-12-06 13:14:50.208+00', 0.75, 1, '2026-12-06 13:14:50.333+00', NULL, NULL, 'anon: I moved to Milan last spring', DEFAULT, '[0.1,-0.2,0.3,0.4]');
INSERT INTO public.records VALUES ('6da2f0c57dbc44da89ac5e6a682b93c4', 2, NULL, 's1', 'assistant', 'g1', NULL, NULL, 1, '{}', '2026-12-06 13:14:50.208+00', 0.5, 1, '2026-12-06 13:14:50.333+00', 'https://example.com/lease.pdf', 'application/pdf', 'anon: the lease PDF for the Milan flat', DEFAULT, '[0.5,0.25,-0.125,1]');
INSERT INTO public.records VALUES ('imported-alice', 12, 'alice', 's2', 'user', NULL, NULL, NULL, 1, '{}', '2025-01-02 03:04:05.678+00', 0.8125, 5, '2025-02-03 04:05:06.789+00', NULL, NULL, 'alice: imported note about trains', DEFAULT, NULL);
INSERT INTO public.records VALUES ('5bb941175c7f4f66a889cce86823ed3d', 18, 'alice', 's1', NULL, NULL, NULL, 'app/prefs/drink', 3, '{"rev": 2}', '2026-12-06 13:14:50.44+00', 0.5, 0, NULL, NULL, NULL, 'alice prefers tea, version 2', DEFAULT, '[0,0,1,0]');
INSERT INTO public.records VALUES ('43b494a1f0e94663a5bb87737f3fe6a8', 10, 'alice', 's1', 'user', NULL, NULL, NULL, 1, '{"f": 0.1, "n": 42, "big": 12345678901234567, "uni": "héllo ✓", "nested": {"l": [1, 2.5, "x", null, true]}}', '2026-12-06 13:14:50.376+00', 0.75, 1, '2026-12-06 13:14:50.488+00', NULL, NULL, 'alice: I moved to Milan last spring', DEFAULT, '[0.1,-0.2,0.3,0.4]');
INSERT INTO public.records VALUES ('4a489d341af94353abbff8e8e40a8d04', 11, 'alice', 's1', 'assistant', 'g1', NULL, NULL, 1, '{}', '2026-12-06 13:14:50.376+00', 0.5, 1, '2026-12-06 13:14:50.488+00', 'https://example.com/lease.pdf', 'application/pdf', 'alice: the lease PDF for the Milan flat', DEFAULT, '[0.5,0.25,-0.125,1]');


--
-- Data for Name: schema_version; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.schema_version VALUES (1, 'records table, b-tree, full-text and metadata indexes', '2026-12-06 13:14:49.975722+00');


--
-- Name: records_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.records_seq', 18, true);


--
-- Name: records records_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.records
    ADD CONSTRAINT records_pkey PRIMARY KEY (id);


--
-- Name: schema_version schema_version_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.schema_version
    ADD CONSTRAINT schema_version_pkey PRIMARY KEY (version);


--
-- Name: records_embedding; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX records_embedding ON public.records USING hnsw (embedding public.vector_cosine_ops);


--
-- Name: records_fts; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX records_fts ON public.records USING gin (fts);


--
-- Name: records_metadata; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX records_metadata ON public.records USING gin (metadata jsonb_path_ops);


--
-- Name: records_owner_created; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX records_owner_created ON public.records USING btree (owner, created_at, seq);


--
-- Name: records_owner_key; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX records_owner_key ON public.records USING btree (owner, key text_pattern_ops) NULLS NOT DISTINCT WHERE (key IS NOT NULL);


--
-- Name: records_owner_session; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX records_owner_session ON public.records USING btree (owner, session, created_at, seq);


--
-- PostgreSQL database dump complete
--

\unrestrict q5Pwf8D69kx8lakKwGY9ABVf6h21c8ZmszmsgfMIWiNgev6TYk3cz7NaXYENgIG

